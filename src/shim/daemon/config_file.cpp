#include "config_file.h"

#include <set>
#include <toml.hpp>

#include "transport_registry.h"

namespace vrdma::shim {
namespace {

// A scalar as the command line would spell it; false for a table or array.
bool scalar_text(const toml::value& v, std::string& out) {
    if (v.is_string()) {
        out = v.as_string().str;
    } else if (v.is_integer()) {
        out = std::to_string(v.as_integer());
    } else if (v.is_floating()) {
        out = std::to_string(v.as_floating());
    } else if (v.is_boolean()) {
        out = v.as_boolean() ? "true" : "false";
    } else {
        return false;
    }
    return true;
}

// KEY = VALUE as --OPTION: a flag for true, nothing for false, the option
// repeated for an array.
bool add_option(const std::string& option, const toml::value& v, std::vector<std::string>& args,
                std::string& error) {
    if (v.is_boolean()) {
        if (v.as_boolean()) args.push_back("--" + option);
        return true;
    }
    std::vector<toml::value> items = v.is_array() ? v.as_array() : std::vector<toml::value>{v};
    for (const toml::value& item : items) {
        std::string text;
        if (!scalar_text(item, text) || item.is_boolean()) {
            error = toml::format_error("'" + option + "' wants a string or a number (or an array of them)", item,
                                       "here");
            return false;
        }
        args.push_back("--" + option);
        args.push_back(text);
    }
    return true;
}

// One [[guest]] table as a --guest argument.
bool guest_arg(const toml::value& g, std::string& out, std::string& error) {
    if (!g.is_table() || !g.contains("name") || !g.at("name").is_string()) {
        error = toml::format_error("each [[guest]] needs name = \"NAME\"", g, "this guest");
        return false;
    }
    out = g.at("name").as_string().str;
    static const std::set<std::string> kKeys = {"name",   "owner",  "group",     "pkeys", "worker",
                                                "weight", "controlled-qkeys", "ip", "vm",    "vm-memory"};
    for (const auto& [key, v] : g.as_table()) {
        if (!kKeys.count(key)) {
            error = toml::format_error("a [[guest]] has no key '" + key +
                                           "' (name, owner, group, pkeys, controlled-qkeys, worker, weight, ip, vm, "
                                           "vm-memory)",
                                       v, "here");
            return false;
        }
        if (key == "name") continue;
        if (key == "controlled-qkeys" || key == "vm") {
            if (!v.is_boolean()) {
                error = toml::format_error(key + " is true or false", v, "here");
                return false;
            }
            if (v.as_boolean()) out += ":" + key;
            continue;
        }
        std::string text;
        if ((key == "pkeys" || key == "ip") && v.is_array()) {
            for (const toml::value& p : v.as_array()) {
                std::string one;
                if (!scalar_text(p, one) || p.is_boolean()) {
                    error = toml::format_error(key == "ip" ? "ip is a list of address strings like \"10.0.0.1\""
                                                           : "pkeys are strings like \"0x8001\" or numbers",
                                               p, "here");
                    return false;
                }
                text += (text.empty() ? "" : ",") + one;
            }
        } else if (!scalar_text(v, text) || v.is_boolean()) {
            error = toml::format_error("'" + key + "' wants a string or a number", v, "here");
            return false;
        }
        out += ":" + key + "=" + text;
    }
    return true;
}

// Options whose value is the next argument.
bool takes_value(const std::string& arg) {
    return arg.rfind("--", 0) == 0 && arg.find('=') == std::string::npos && option_takes_value(arg);
}

// A repeatable transport option (--fabric-peer): the command line's
// values replace the file's.
bool repeatable(const std::string& arg) {
    const TransportOption* t = find_transport_option(arg.substr(0, arg.find('=')));
    return t && t->repeatable;
}

}  // namespace

bool option_takes_value(const std::string& name) {
    if (name == "--help" || name == "-h") return false;
    const TransportOption* t = find_transport_option(name);
    return !t || t->value;
}

std::string guest_arg_name(const std::string& arg) { return arg.substr(0, arg.find(':')); }

bool config_to_args(const std::string& path, std::vector<std::string>& args, std::string& error) {
    toml::value root;
    try {
        root = toml::parse(path);
    } catch (const std::exception& e) {
        error = "config " + path + ": " + e.what();
        return false;
    }
    try {
        for (const auto& [key, v] : root.as_table()) {
            if (key == "guest") {
                if (!v.is_array()) {
                    error = toml::format_error("guests are [[guest]] tables", v, "here");
                    break;
                }
                for (const toml::value& g : v.as_array()) {
                    std::string arg;
                    if (!guest_arg(g, arg, error)) break;
                    args.push_back("--guest");
                    args.push_back(arg);
                }
            } else if (key == "quota" && v.is_table()) {
                for (const auto& [q, n] : v.as_table()) {
                    std::string text;
                    if (!scalar_text(n, text) || n.is_boolean()) {
                        error = toml::format_error("a quota is a number", n, "here");
                        break;
                    }
                    args.push_back("--quota");
                    args.push_back(q + "=" + text);
                }
            } else if (v.is_table()) {  // [fabric] listen = ... is --fabric-listen
                for (const auto& [sub, sv] : v.as_table())
                    if (!add_option(key + "-" + sub, sv, args, error)) break;
            } else if (key == "config") {
                error = toml::format_error("a config file cannot name another", v, "here");
            } else {
                add_option(key, v, args, error);
            }
            if (!error.empty()) break;
        }
    } catch (const std::exception& e) {
        error = e.what();
    }
    if (!error.empty()) {
        error = "config " + path + ": " + error;
        return false;
    }
    return true;
}

std::vector<std::string> merge_args(const std::vector<std::string>& file, const std::vector<std::string>& cli) {
    std::set<std::string> cli_guests, cli_lists;
    for (size_t i = 0; i < cli.size(); ++i) {
        if (cli[i] == "--guest" && i + 1 < cli.size()) cli_guests.insert(guest_arg_name(cli[i + 1]));
        if (cli[i].rfind("--guest=", 0) == 0) cli_guests.insert(guest_arg_name(cli[i].substr(8)));
        if (repeatable(cli[i])) cli_lists.insert(cli[i].substr(0, cli[i].find('=')));
    }
    std::vector<std::string> out;
    for (size_t i = 0; i < file.size(); ++i) {
        const bool valued = takes_value(file[i]) && i + 1 < file.size();
        const bool drop = (file[i] == "--guest" && valued && cli_guests.count(guest_arg_name(file[i + 1]))) ||
                          cli_lists.count(file[i]);
        if (!drop) {
            out.push_back(file[i]);
            if (valued) out.push_back(file[i + 1]);
        }
        if (valued) ++i;
    }
    out.insert(out.end(), cli.begin(), cli.end());
    return out;
}

}  // namespace vrdma::shim
