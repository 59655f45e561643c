// The shim's configuration file (vrdma-shim --config FILE): TOML, read with
// toml11, turned into the command line's own options so that the file can
// say everything the command line can and both are checked by one parser.
//
//   run-dir = "/run/vrdma"          # each key is a long option without "--"
//   workers = 2
//   log-level = "info"
//   hca-local = true                # a flag: true gives it, false leaves it out
//   [fabric]                        # [fabric] KEY is --fabric-KEY
//   listen = "10.0.0.1:7400"
//   peer = ["10.0.0.2:7400"]        # an array repeats the option
//   key = "/etc/vrdma/fabric.key"
//   [quota]                         # [quota] KEY = N is --quota KEY=N
//   qps = 1024
//   [[guest]]                       # each [[guest]] is one --guest
//   name = "a"
//   owner = "alice"                 # owner, group, pkeys, controlled-qkeys,
//   pkeys = ["0x8001"]              # worker, weight: as --guest NAME:KEY=...
//   weight = 3
//
// The command line overrides the file: a scalar option given there wins, a
// list option given there (a repeatable transport option: --fabric-peer)
// replaces the file's, and a
// --guest there replaces the file's guest of the same name.
#pragma once

#include <string>
#include <vector>

namespace vrdma::shim {

// The options FILE says, in command-line form ("--run-dir", "/run/vrdma",
// "--guest", "a:owner=alice", ...). False with `error` naming the file, and
// the line where toml11 knows it, on a syntax error or a value of the wrong
// kind.
bool config_to_args(const std::string& path, std::vector<std::string>& args, std::string& error);

// The file's arguments merged with the command line's (`cli`, without
// --config) as described above: the effective command line.
std::vector<std::string> merge_args(const std::vector<std::string>& file, const std::vector<std::string>& cli);

// Whether option `name` (no "=value") takes a value: every one but the
// flags (--help, and the transports' flags: --hca-local).
bool option_takes_value(const std::string& name);

// The name of a --guest argument ("a" of "a:owner=alice").
std::string guest_arg_name(const std::string& arg);

}  // namespace vrdma::shim
