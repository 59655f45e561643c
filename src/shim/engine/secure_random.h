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

// Fuzz harnesses only: from now on (this thread) the numbers are a fixed
// sequence of `seed`, not secret, so that a harness's QPNs and keys are the
// same in every run and its seed inputs can name them. The shim never calls it.
void secure_random_make_predictable(uint64_t seed);

}  // namespace vrdma::shim
