// Catch2's runner (its implementation and main()) for the three Catch2
// programs: the unit tests, the verbs suite and the rdma_cm suite. One
// object, compiled once (test/CMakeLists.txt says why).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
