// Streamed responses (client/protocol.json's stream entries): the arguments of one keyed
// call and its attempt's transaction, and the sink that captures a stream on its way to
// the transport. Private to the library.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "detail.hpp"
#include "idem/client.hpp"

namespace idem {

/// One keyed request's arguments to idempotency.begin(), complete() and
/// save_final(), kept alive for every attempt (and copied into a stream that
/// completes the key after handle() has returned).
struct Client::Call : detail::KeyCall {};

namespace detail {
class PipelinedTransaction;
}  // namespace detail

/// One attempt's transaction, opened with begin() in it, and what begin() returned.
struct Client::Attempt {
    /// The transaction that holds the key: a pqxx::work, or pipelined.
    std::unique_ptr<pqxx::transaction_base> tx;
    /// `tx` when it is a pqxx::work (what a Handler takes).
    pqxx::work* work = nullptr;
    /// `tx` when it is pipelined: complete() then travels with COMMIT.
    detail::PipelinedTransaction* pipelined = nullptr;
    /// begin()'s outcome.
    std::string outcome;
    /// The key row's expiry in seconds since the epoch (none without a row).
    std::optional<long long> expires;
    /// The extension's answer of an outcome that does not run the handler.
    std::optional<Response> answer;
};

namespace detail {

/// Forwards every chunk to the transport and keeps a copy while the total stays within
/// `limit` bytes; past it the copy is dropped (over_limit()) and chunks are only forwarded.
class CapturingSink final : public ChunkSink {
public:
    CapturingSink(ChunkSink& out, std::size_t limit) : out_(out), limit_(limit) {}

    /// Empty chunks are skipped; after the peer has gone nothing more is sent.
    bool write(std::string_view chunk) override;

    /// The concatenated chunks (empty when over_limit()).
    const std::string& body() const noexcept { return body_; }
    /// The stored `:chunks` value: the chunks' lengths, comma-separated.
    std::string lengths() const;
    /// True when the stream grew past the limit.
    bool over_limit() const noexcept { return over_limit_; }
    /// True when the transport reported the peer gone.
    bool peer_gone() const noexcept { return peer_gone_; }

private:
    ChunkSink& out_;
    std::size_t limit_;
    std::string body_;
    std::vector<std::size_t> lengths_;
    bool over_limit_ = false;
    bool peer_gone_ = false;
};

/// The stored headers of a streamed response: the kept headers, then `:chunks` with the
/// lengths, or only `:not_kept` when the stream was too large (a JSON array of pairs).
std::string stream_headers_json(const Response& response, const std::vector<std::string>& kept,
                                const CapturingSink& capture);

}  // namespace detail

}  // namespace idem
