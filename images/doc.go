// Package images reads engine images, manifests only: references, the
// variant metadata CI publishes (or that is derived from an image's
// config), and the choice of the variant a node can run.
//
// Start with Resolver.Resolve, which reads a reference (an annotated index,
// or any image) into a Set of variants; then Choose, which orders the
// variants a node's facts can run, under an Override (ParseOverride), into
// candidates, with a reason for every variant it rejects. LoadOverrides and
// UpdateOverrides keep the operator's overrides file.
//
// provision.Plan calls these for a want; call them directly only to read
// images without provisioning. The metadata is docs/image-metadata.md.
package images
