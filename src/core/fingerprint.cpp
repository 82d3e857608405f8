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

}  // namespace

Digest sha256(std::string_view data) {
    Digest digest{};
    unsigned int length = 0;
    if (EVP_Digest(data.data(), data.size(), digest.data(), &length, sha256_algorithm(), nullptr) != 1 ||
        length != digest.size())
        throw std::runtime_error("SHA-256 computation failed");
    return digest;
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

void check_method(std::string_view method) {
    if (method.empty()) throw InvalidRequest("HTTP method is empty");
    for (char c : method)
        if (!is_tchar(static_cast<unsigned char>(c)))
            throw InvalidRequest("HTTP method is not a token (RFC 9110)");
}

void check_path(std::string_view path) {
    if (path.find('\n') != std::string_view::npos) throw InvalidRequest("path contains a line feed");
}

std::string canonical_body(std::optional<std::string_view> body, const std::vector<JsonPointer>& exclude,
                           const CanonicalizeOptions& options) {
    if (!body || body->empty()) return {};
    std::string canonical;
    JsonError error;
    if (canonicalize(*body, canonical, error, options, &exclude)) return canonical;
    if (error.code == JsonErrc::too_deep) throw JsonException(error);
    return std::string(*body);
}

Digest fingerprint(std::string_view method, std::string_view path, std::optional<std::string_view> body,
                   const std::vector<JsonPointer>& exclude, const CanonicalizeOptions& options) {
    check_method(method);
    check_path(path);
    std::string upper(method);
    for (char& c : upper)
        if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');

    std::unique_ptr<EVP_MD_CTX, ContextDeleter> context(EVP_MD_CTX_new());
    if (!context || EVP_DigestInit_ex(context.get(), sha256_algorithm(), nullptr) != 1)
        throw std::runtime_error("SHA-256 initialisation failed");
    auto update = [&](const void* data, std::size_t size) {
        if (EVP_DigestUpdate(context.get(), data, size) != 1) throw std::runtime_error("SHA-256 update failed");
    };
    update(upper.data(), upper.size());
    update("\n", 1);
    update(path.data(), path.size());
    update("\n", 1);
    if (body && !body->empty()) {
        std::string canonical;
        JsonError error;
        if (canonicalize(*body, canonical, error, options, &exclude)) {
            update(canonical.data(), canonical.size());
        } else if (error.code == JsonErrc::too_deep) {
            throw JsonException(error);
        } else {
            update(body->data(), body->size());
        }
    }
    Digest digest{};
    unsigned int length = 0;
    if (EVP_DigestFinal_ex(context.get(), digest.data(), &length) != 1 || length != digest.size())
        throw std::runtime_error("SHA-256 finalisation failed");
    return digest;
}

}  // namespace idem::core
