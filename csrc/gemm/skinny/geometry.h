// The M <= 16 tier's work geometry, which its kernels and the dispatch policy's measured rules
// share (host and device): a unit's activation rows, and the register-streaming kernel's weight tile
// and token tiles.
#pragma once

#include <cstdint>

namespace fp4_gemm::skinny {

constexpr int kMaxTokens = 16;        // activation rows of a staged kernel's unit (two token tiles)
constexpr int kStreamTileRows = 16;   // weight rows of a register-streaming warp: one mma's M side
constexpr int kStreamMaxTokens = 64;  // 8 token tiles

// The register-streaming kernel's token tiles for m activation rows: 1, 2, 4 or 8.
constexpr int stream_token_tiles(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

}  // namespace fp4_gemm::skinny
