{
  description = "fp4-gemm: block-scaled FP8/FP4 GEMMs and quantizers (kernels-hub package)";

  inputs = {
    kernel-builder.url = "github:huggingface/kernels";
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
