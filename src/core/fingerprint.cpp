#include "fingerprint.hpp"

#include <cstring>
#include <memory>
#include <stdexcept>

#include <openssl/evp.h>

namespace idem::core {

namespace {

// OpenSSL 3 looks the algorithm up on every EVP_sha256() use unless it is
// fetched once; the fetched object is immutable and safe to share.
const EVP_MD* sha256_algorithm() {
    static EVP_MD* algorithm = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    if (algorithm == nullptr) throw std::runtime_error("OpenSSL has no SHA-256");
    return algorithm;
}

struct ContextDeleter {
    void operator()(EVP_MD_CTX* context) const { EVP_MD_CTX_free(context); }
};

bool is_tchar(unsigned char c) {
    if ((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) return true;
    return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

// One digest context per thread, reused by every Hasher (EVP_DigestInit_ex
// resets it): a fingerprint then allocates no context of its own.
EVP_MD_CTX* thread_context() {
    thread_local std::unique_ptr<EVP_MD_CTX, ContextDeleter> context(EVP_MD_CTX_new());
    return context.get();
}

// An EVP digest in progress; update() feeds large inputs in kHashChunk pieces
// and asks the probe before each. One at a time per thread (they share the
// thread's context).
class Hasher {
public:
    explicit Hasher(InterruptProbe probe) : context_(thread_context()), probe_(probe) {
        if (context_ == nullptr || EVP_DigestInit_ex(context_, sha256_algorithm(), nullptr) != 1)
            throw std::runtime_error("SHA-256 initialisation failed");
    }
    void update(std::string_view data) {
        do {
            const std::size_t n = data.size() < kHashChunk ? data.size() : kHashChunk;
            if (data.size() > kHashChunk) check_interrupt(probe_);
            if (EVP_DigestUpdate(context_, data.data(), n) != 1)
                throw std::runtime_error("SHA-256 update failed");
            data.remove_prefix(n);
        } while (!data.empty());
    }
    Digest finish() {
        Digest digest{};
        unsigned int length = 0;
        if (EVP_DigestFinal_ex(context_, digest.data(), &length) != 1 || length != digest.size())
            throw std::runtime_error("SHA-256 finalisation failed");
        return digest;
    }

private:
    EVP_MD_CTX* context_;
    InterruptProbe probe_;
};

}  // namespace

Digest sha256(std::string_view data, InterruptProbe probe) {
    if (probe == nullptr || data.size() <= kHashChunk) {  // one call, as before
        Digest digest{};
        unsigned int length = 0;
        if (EVP_Digest(data.data(), data.size(), digest.data(), &length, sha256_algorithm(),
                       nullptr) != 1 ||
            length != digest.size())
            throw std::runtime_error("SHA-256 computation failed");
        return digest;
    }
    Hasher hasher(probe);
    hasher.update(data);
    return hasher.finish();
}

std::string to_hex(const Digest& digest) {
    static const char hex[] = "0123456789abcdef";
    std::string text(digest.size() * 2, '0');
    for (std::size_t i = 0; i < digest.size(); ++i) {
        text[2 * i] = hex[digest[i] >> 4];
        text[2 * i + 1] = hex[digest[i] & 15];
    }
    return text;
}

void check_method(std::string_view method, InterruptProbe probe) {
    if (method.empty()) throw InvalidRequest("HTTP method is empty");
    for (std::size_t i = 0; i < method.size(); ++i) {
        if (i % kPollBytes == kPollBytes - 1) check_interrupt(probe);
        if (!is_tchar(static_cast<unsigned char>(method[i])))
            throw InvalidRequest("HTTP method is not a token (RFC 9110)");
    }
}

void check_path(std::string_view path) {
    if (path.find('\n') != std::string_view::npos)
        throw InvalidRequest("path contains a line feed");
}

Digest fingerprint(std::string_view method, std::string_view path,
                   std::optional<std::string_view> body, const std::vector<JsonPointer>& exclude,
                   const CanonicalizeOptions& options) {
    PointerList list;
    for (std::size_t i = 0; i < exclude.size(); ++i) {
        if (i % kPollItems == kPollItems - 1) check_interrupt(options.interrupt);
        list.add(exclude[i]);
    }
    return fingerprint_excluding(method, path, body, list, options);
}

Digest fingerprint_excluding(std::string_view method, std::string_view path,
                             std::optional<std::string_view> body, const PointerList& exclude,
                             const CanonicalizeOptions& options) {
    const InterruptProbe probe = options.interrupt;
    check_method(method, probe);
    check_path(path);
    std::string upper(method);
    for (std::size_t i = 0; i < upper.size(); ++i) {
        if (i % kPollBytes == kPollBytes - 1) check_interrupt(probe);
        if (upper[i] >= 'a' && upper[i] <= 'z') upper[i] = static_cast<char>(upper[i] - 'a' + 'A');
    }

    Hasher hasher(probe);
    hasher.update(upper);
    hasher.update("\n");
    hasher.update(path);
    hasher.update("\n");
    if (body && !body->empty()) {
        // Kept per thread: its capacity serves the next body without a new
        // allocation (up to 1 MiB; a larger one is given back).
        thread_local std::string canonical;
        struct Trim {  // also when an interrupt or an error leaves early
            ~Trim() {
                if (canonical.capacity() > (std::size_t{1} << 20)) std::string().swap(canonical);
            }
        } trim;
        JsonError error;
        const bool ok = canonicalize(*body, canonical, error, options, exclude);
        if (!ok && error.code == JsonErrc::too_deep) throw JsonException(error);
        hasher.update(ok ? std::string_view(canonical) : *body);
    }
    return hasher.finish();
}

}  // namespace idem::core
