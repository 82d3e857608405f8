// libFuzzer target for the canonicalizer.
//
// Properties checked on every input, beyond "no crash, no sanitizer report":
//  - accepted input canonicalizes to a fixed point: jcs(jcs(x)) == jcs(x);
//  - the canonical form is accepted again with the same depth limit;
//  - fingerprint() never throws for a body that canonicalize() accepts or
//    rejects for a reason other than depth.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fingerprint.hpp"
#include "jcs.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view input(reinterpret_cast<const char*>(data), size);
    idem::core::CanonicalizeOptions options;
    options.max_depth = 64;
    std::string first;
    idem::core::JsonError error;
    const bool ok = idem::core::canonicalize(input, first, error, options);
    if (ok) {
        std::string second;
        idem::core::JsonError again;
        if (!idem::core::canonicalize(first, second, again, options) || second != first)
            std::abort();
    } else if (error.offset > size) {
        std::abort();  // the offset must point into the input
    }
    try {
        idem::core::fingerprint("POST", "/fuzz", input, {}, options);
    } catch (const idem::core::JsonException& e) {
        if (e.error().code != idem::core::JsonErrc::too_deep) std::abort();
    }
    return 0;
}
