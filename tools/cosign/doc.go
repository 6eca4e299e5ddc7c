// Package cosign proves that gpupin's signatures and cosign's are the same
// thing: what trust.Signer (gpupin publish/build --sign-key) writes passes
// cosign's own verification code, what cosign's own signing code writes
// passes gpupin's trust.Verifier, and a key cosign generated loads in
// gpupin. All against a real registry (go-containerregistry's) on loopback.
//
// It is a module of its own, as tools/helm and tools/dist are, so cosign's
// dependency graph (its cloud KMS clients, TUF, Rekor and Fulcio clients)
// stays out of the module gpupin ships: `make test-cosign` runs it, and
// `make check` vets it.
package cosign
