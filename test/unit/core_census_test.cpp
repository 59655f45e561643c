// The rule by which a worker's idle pass yields its CPU (core_census.h).
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <string>

#include "core_census.h"
#include "temp_dir.h"

using vrdma::shim::CoreCensus;

namespace {
unsigned running_in(const char* text) { return CoreCensus::parse_running(text, std::strlen(text)); }
}  // namespace

TEST_CASE("the idle pass yields only where a runnable thread has no CPU", "[worker][idle]") {
    SECTION("the rule: no more runnable threads than CPUs") {
        // A 2-core host with the shim and two polling guests: yield.
        CHECK_FALSE(CoreCensus::spare(3, 2));
        // The shim and one client thread on 2 cores: a core each.
        CHECK(CoreCensus::spare(2, 2));
        CHECK(CoreCensus::spare(4, 16));
        CHECK_FALSE(CoreCensus::spare(17, 16));
        // Nothing known: yield, as always.
        CHECK_FALSE(CoreCensus::spare(0, 2));
        CHECK_FALSE(CoreCensus::spare(2, 0));
    }
    SECTION("the count is /proc/loadavg's running threads") {
        CHECK(running_in("0.30 1.52 1.90 1/109 29668\n") == 1);
        CHECK(running_in("12.00 11.50 10.25 17/2301 4242\n") == 17);
        CHECK(running_in("0.00 0.00 0.00 123456789/999 1\n") == 123456789);
        CHECK(running_in("0.00 0.00 0.00 1234567890/999 1\n") == 0);  // too long to be a count
        CHECK(running_in("0.00 0.00 0.00 /109 1\n") == 0);
        CHECK(running_in("garbage") == 0);
        CHECK(running_in("") == 0);
    }
    SECTION("read from this host, sampled") {
        CoreCensus census;
        // Whatever the answer, it stays the same within a sample's time.
        const bool first = census.cores_to_spare(1'000'000'000);
        CHECK(census.cores_to_spare(1'000'000'000 + CoreCensus::kSpareSampleNs - 1) == first);
    }
}

TEST_CASE("a count that says cores are spare is read again ten times sooner than one that says none are",
          "[worker][idle]") {
    vrdma::test::TempDir dir("vrdma-census");
    const std::string path = dir.path + "/loadavg";
    auto write_running = [&](unsigned running) {
        std::ofstream(path, std::ios::trunc) << "0.50 0.40 0.30 " << running << "/321 4242\n";
    };
    write_running(1);  // this thread alone: a core to spare wherever the test runs
    CoreCensus census(path.c_str());
    REQUIRE(census.cpus() > 0);
    const unsigned crowd = census.cpus() + 1;  // one runnable thread without a CPU
    const uint64_t t0 = 1'000'000'000;
    CHECK(census.cores_to_spare(t0));
    // A guest starts polling: seen within kSpareSampleNs, not kSampleNs.
    write_running(crowd);
    CHECK(census.cores_to_spare(t0 + CoreCensus::kSpareSampleNs - 1));  // the sample still holds
    const uint64_t t1 = t0 + CoreCensus::kSpareSampleNs;
    CHECK_FALSE(census.cores_to_spare(t1));
    // It stops: "none to spare" holds for the longer time, so the worker
    // keeps yielding until then.
    write_running(1);
    CHECK_FALSE(census.cores_to_spare(t1 + CoreCensus::kSpareSampleNs));
    CHECK_FALSE(census.cores_to_spare(t1 + CoreCensus::kSampleNs - 1));
    CHECK(census.cores_to_spare(t1 + CoreCensus::kSampleNs));
    // A count that cannot be read means yield.
    std::ofstream(path, std::ios::trunc) << "garbage\n";
    CHECK_FALSE(census.cores_to_spare(t1 + 2 * CoreCensus::kSampleNs));
    CHECK_FALSE(CoreCensus("/nonexistent/loadavg").cores_to_spare(t0));
}
