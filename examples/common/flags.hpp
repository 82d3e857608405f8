// Shared by the examples: `--name value` command-line flags.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>

namespace examples {

/// Parses `--name value` pairs. Each known flag has a setter; an unknown flag,
/// a flag without a value, or a number that does not parse prints `usage` and
/// returns false.
class Flags {
public:
    explicit Flags(std::string usage) : usage_(std::move(usage)) {}

    /// A flag whose value is kept as text.
    Flags& text(const std::string& name, std::string* target) {
        setters_[name] = [target](const std::string& value) {
            *target = value;
            return true;
        };
        return *this;
    }

    /// A flag whose value is a non-negative integer.
    Flags& number(const std::string& name, int* target) {
        setters_[name] = [target](const std::string& value) {
            char* end = nullptr;
            const long parsed = std::strtol(value.c_str(), &end, 10);
            if (value.empty() || *end != '\0' || parsed < 0 || parsed > 1000000000) return false;
            *target = static_cast<int>(parsed);
            return true;
        };
        return *this;
    }

    /// Applies argv; false (after printing the usage) when it does not parse.
    bool parse(int argc, char** argv) const {
        for (int i = 1; i < argc; i += 2) {
            const auto setter = setters_.find(argv[i]);
            if (setter == setters_.end() || i + 1 >= argc || !setter->second(argv[i + 1])) {
                std::fprintf(stderr, "usage: %s\n", usage_.c_str());
                return false;
            }
        }
        return true;
    }

private:
    std::string usage_;
    std::map<std::string, std::function<bool(const std::string&)>> setters_;
};

}  // namespace examples
