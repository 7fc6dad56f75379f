{
  description = "fp4-gemm: block-scaled FP8/FP4 GEMMs and quantizers (kernels-hub package)";

  inputs = {
    # Pinned to the release of the kernels client the package is tested with (0.19.1: build.toml
    # edition 6, digests in metadata.json). No flake.lock can be made without Nix; `nix flake lock`
    # pins the commit behind the tag.
    kernel-builder.url = "github:huggingface/kernels/v0.19.1";
  };

  # Release builds: `nix build .#bundle` (every variant), `nix run .#build-and-copy` (into ./build),
  # `nix run .#build-and-upload`, `nix develop`, `nix run .#ci-test`. Sources, arch sections and
  # flags come from build.toml, which tools/build.py also reads for local builds.
  outputs =
    { self, kernel-builder }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
    };
}
