// Package build is CI's side of gpupin: it publishes engine variants as one
// tag whose OCI index carries gpupin's io.gpupin.* metadata, and assembles
// variant images without a Docker engine.
//
// Call Publish with the tag and each variant's image: it checks every
// variant against its own config, pushes the index and an alias tag per
// variant, and reads them back as a node would. Call Build with a Spec
// (LoadSpec reads gpupin.yaml) to assemble images reproducibly into an OCI
// layout and, with Push, publish them. Registries are reached through a
// registry.Policy, as nodes reach them.
package build
