// Streamed responses: captured chunk by chunk on their way to the transport, completed
// when they end, replayed with the same chunks (client/protocol.json, docs/client.md).
#include "stream.hpp"

#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "detail.hpp"
#include "pqxx_compat.hpp"

namespace idem {

namespace detail {

bool CapturingSink::write(std::string_view chunk) {
    if (chunk.empty()) return !peer_gone_;
    if (peer_gone_) return false;
    if (!over_limit_) {
        if (chunk.size() > limit_ - body_.size()) {
            over_limit_ = true;  // nothing of the body is kept: never a truncated one
            std::string().swap(body_);
            lengths_.clear();
        } else {
            body_.append(chunk);
            lengths_.push_back(chunk.size());
        }
    }
    if (!out_.write(chunk)) peer_gone_ = true;
    return !peer_gone_;
}

std::string CapturingSink::lengths() const {
    std::string text;
    for (std::size_t i = 0; i < lengths_.size(); ++i) {
        if (i > 0) text += ',';
        text += std::to_string(lengths_[i]);
    }
    return text;
}

std::string stream_headers_json(const Response& response, const std::vector<std::string>& kept,
                                const CapturingSink& capture) {
    if (capture.over_limit())
        return nlohmann::json::array({{not_kept_entry, "stream-too-large"}}).dump();
    nlohmann::json pairs = nlohmann::json::parse(kept_headers_json(response, kept));
    pairs.push_back({stream_chunks_entry, capture.lengths()});
    return pairs.dump();
}

}  // namespace detail

namespace {

/// Rolls back and ends a stream's transaction (a failed rollback: the connection is gone,
/// and the server rolls back).
void roll_back(std::unique_ptr<pqxx::transaction_base>& tx) noexcept {
    try {
        tx->abort();
    } catch (...) {
    }
    tx.reset();
}

}  // namespace

/// A started streamed response between handle() and the end of its stream: the open
/// transaction that holds the key, and what completing the key needs.
struct Client::StreamState {
    Attempt attempt;  // its tx holds the key until the stream ends
    Response head;    // status, headers, resource id, secret flag; its stream is the handler's

    StreamState() = default;
    StreamState(const StreamState&) = delete;
    StreamState& operator=(const StreamState&) = delete;
    // A stream the transport never ran (its Response dropped): rolled back, nothing stored.
    ~StreamState() {
        if (attempt.tx) roll_back(attempt.tx);
    }
};

Response Client::stream_response(const Call& call, Attempt attempt, Response response,
                                 Disposition disposition) {
    auto state = std::make_shared<StreamState>();
    state->attempt = std::move(attempt);
    Response sent = response;  // what the transport sends: the head and a wrapped stream
    state->head = std::move(response);
    sent.stream = [this, call, state, disposition](ChunkSink& out) {
        if (!state->attempt.tx) throw std::logic_error("a streamed response runs once");
        detail::CapturingSink capture(out, options_.max_stream_bytes);
        try {
            state->head.stream(capture);
        } catch (...) {
            roll_back(state->attempt.tx);  // a broken stream: nothing stored, the retry runs again
            throw;
        }
        finish_stream(call, state->attempt, state->head, disposition, capture);
    };
    return detail::stamped(std::move(sent), state->attempt.expires);
}

void Client::finish_stream(const Call& call, Attempt& attempt, const Response& head,
                           Disposition disposition, const detail::CapturingSink& capture) {
    if (disposition == Disposition::discard || capture.peer_gone()) {
        roll_back(attempt.tx);  // not final, or not received: nothing stored, the retry runs again
        return;
    }
    if (capture.over_limit()) ++counters_.streams_not_kept;
    const std::string headers = detail::stream_headers_json(head, options_.kept_headers, capture);
    Response stored = head;
    stored.body = capture.body();
    if (disposition == Disposition::store_error) {
        roll_back(attempt.tx);  // a final error has no effect to keep
        store_final_error(call, stored, headers);
        return;
    }
    complete(attempt, call, stored, headers);
    attempt.tx.reset();
}

}  // namespace idem
