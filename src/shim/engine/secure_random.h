// Unpredictable numbers for what a tenant must not guess: QP numbers,
// lkeys and rkeys (docs/reliability.md "Tenants"). They come from the
// kernel's CSPRNG (getrandom), drawn a buffer at a time so that creating
// objects in bulk costs one syscall per 512 numbers. Control path only.
#pragma once

#include <cstdint>

namespace vrdma::shim {

// 32 random bits. Aborts the shim if the kernel cannot supply them
// (getrandom never fails on Linux >= 3.17 once the pool is initialised).
uint32_t secure_random_u32();

}  // namespace vrdma::shim
