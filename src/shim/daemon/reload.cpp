// Daemon::reload: the --config file read again (vrdmactl reload, SIGHUP).
// Guests the file (or the command line) adds are added, guests it no longer
// names are removed, weights follow; anything else that changed would need
// a restart and is refused with the reason. Guests added by vrdmactl guest
// add are not the file's and stay.
#include <map>
#include <set>

#include "config_file.h"
#include "event_loop.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {

// The options other than --guest, as OPTION -> values, in order.
std::map<std::string, std::vector<std::string>> non_guest_options(const std::vector<std::string>& args) {
    std::map<std::string, std::vector<std::string>> out;
    for (size_t i = 0; i < args.size(); ++i) {
        std::string name = args[i], value;
        if (auto eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
            value = name.substr(eq + 1);
            name.resize(eq);
        } else if (option_takes_value(name) && i + 1 < args.size()) {
            value = args[++i];
        }
        if (name != "--guest") out[name].push_back(value);
    }
    return out;
}

// --guest arguments by name.
std::map<std::string, std::string> guest_args(const std::vector<std::string>& args) {
    std::map<std::string, std::string> out;
    for (size_t i = 0; i < args.size(); ++i) {
        std::string arg;
        if (args[i] == "--guest" && i + 1 < args.size()) arg = args[++i];
        else if (args[i].rfind("--guest=", 0) == 0) arg = args[i].substr(8);
        else continue;
        out[arg.substr(0, arg.find(':'))] = arg;
    }
    return out;
}

bool same_access(const GuestAccess& a, const GuestAccess& b) {
    return a.owner == b.owner && a.has_group == b.has_group && (!a.has_group || a.group == b.group);
}

}  // namespace

std::string Daemon::reload(bool& ok) {
    ok = false;
    if (opts_.config_file.empty()) return "the shim was started without --config: there is nothing to reload";
    std::vector<std::string> args;
    std::string error;
    Options fresh;
    if (!effective_args(opts_.config_file, opts_.cli_args, args, error) || !parse_args(args, fresh, error)) {
        LOG_WARN("reload: %s (nothing changed)", error.c_str());
        return error + " (nothing changed)";
    }

    std::vector<std::string> done, refused;
    const auto before = non_guest_options(opts_.args), after = non_guest_options(args);
    std::set<std::string> names;
    for (auto& [k, v] : before) names.insert(k);
    for (auto& [k, v] : after) names.insert(k);
    for (const std::string& k : names) {
        auto b = before.find(k), a = after.find(k);
        if (b == before.end() || a == after.end() || b->second != a->second)
            refused.push_back(k + " changed: it needs a restart of the shim (not applied)");
    }

    const auto wanted = guest_args(args);
    for (const auto& [name, arg] : wanted) {
        std::string unused;
        const int i = guest_index(name, unused);
        if (i < 0) {
            std::string why;
            std::string line = add_guest(arg, why);
            if (line.empty()) {
                refused.push_back("guest " + name + " not added: " + why);
            } else {
                from_config_.insert(name);
                done.push_back("added " + line.substr(0, line.find('\n')));
            }
            continue;
        }
        Options one;
        if (!parse_guest_arg(arg, one, error)) {  // checked by parse_args already
            refused.push_back("guest " + name + ": " + error);
            continue;
        }
        const size_t k = size_t(i);
        const bool worker_moved = one.worker_of[0] >= 0 && uint32_t(one.worker_of[0]) != worker_of_[k];
        if (!same_access(one.access[0], opts_.access[k]) || one.pkeys[0] != opts_.pkeys[k] ||
            one.controlled_qkeys[0] != opts_.controlled_qkeys[k] || worker_moved) {
            refused.push_back("guest " + name +
                              ": its owner, group, partitions, controlled qkeys or worker changed, which its "
                              "running processes cannot follow: vrdmactl guest remove " + name +
                              ", then reload (not applied)");
            continue;
        }
        from_config_.insert(name);
        if (one.weights[0] != opts_.weights[k]) {
            if (set_weight(name, std::to_string(one.weights[0]), error)) {
                opts_.weights[k] = one.weights[0];
                done.push_back("weight " + name + " " + std::to_string(one.weights[0]));
            } else {
                refused.push_back("guest " + name + ": weight not changed: " + error);
            }
        }
    }
    for (auto it = from_config_.begin(); it != from_config_.end();) {
        const std::string name = *it;
        std::string unused;
        if (wanted.count(name) || guest_index(name, unused) < 0) {
            ++it;
            continue;
        }
        if (remove_guest(name, error)) {
            done.push_back("removed " + name);
            it = from_config_.erase(it);
        } else {
            refused.push_back("guest " + name + " not removed: " + error);
            ++it;
        }
    }
    std::string text;
    for (const std::string& l : done) text += l + "\n";
    for (const std::string& l : refused) text += "refused: " + l + "\n";
    if (text.empty()) text = "nothing changed\n";
    ok = refused.empty();
    for (const std::string& l : done) LOG_INFO("reload of %s: %s", opts_.config_file.c_str(), l.c_str());
    for (const std::string& l : refused) LOG_WARN("reload of %s: refused: %s", opts_.config_file.c_str(), l.c_str());
    return text;
}

}  // namespace vrdma::shim
