// Pieces shared by Client (transactional protocol) and LeaseRunner (leases).
#include "detail.hpp"

#include <memory>
#include <new>

#include <libpq-fe.h>
#include <nlohmann/json.hpp>

#include "pqxx_compat.hpp"
#include "statuses.hpp"

namespace idem {

namespace detail {

std::string upper(std::string text) {
    for (char& c : text)
        if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    return text;
}

bool valid_key(const std::string& key, std::size_t max_length) {
    if (key.empty() || key.size() > max_length) return false;
    for (char c : key)
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e)
            return false;
    return true;
}

FinalStatuses parse_final_statuses(const std::string& text) {
    core::StatusTable table;
    if (!core::parse_status_list(text, table))
        throw std::invalid_argument("final_statuses is not a list of status codes and classes: " +
                                    text);
    return table;
}

bool is_final(FinalStatuses& cache, PqxxConnection& connection, int status) {
    if (!cache) {
        pqxx::nontransaction query(connection);
        core::StatusTable table{};
        for (const auto& row : query.exec("SELECT s FROM pg_catalog.generate_series(100, 599) AS s "
                                          "WHERE idempotency.is_final(s)"))
            table[static_cast<std::size_t>(row[0].as<int>() - 100)] = true;
        cache = table;
    }
    return status >= 100 && status <= 599 && (*cache)[static_cast<std::size_t>(status - 100)];
}

std::string kept_headers_json(const Response& response, const std::vector<std::string>& kept) {
    // An array of [name, value] pairs keeps the headers' order and repeated
    // names (Set-Cookie, Link); the server accepts it since 0.6.0.
    nlohmann::json pairs = nlohmann::json::array();
    for (const auto& [name, value] : response.headers) {
        // The expiry header is the key's, added to every answer: never stored.
        if (header_name_equal(name, expires_header)) continue;
        for (const std::string& wanted : kept)
            if (header_name_equal(name, wanted)) {
                pairs.push_back({name, value});
                break;
            }
    }
    return pairs.dump();
}

namespace {

// The bytes of a bytea column sent as text (hex format).
std::string unescape_bytea(const std::string& text) {
    std::size_t length = 0;
    unsigned char* bytes =
        PQunescapeBytea(reinterpret_cast<const unsigned char*>(text.c_str()), &length);
    if (bytes == nullptr) throw std::bad_alloc();
    std::string decoded(reinterpret_cast<const char*>(bytes), length);
    PQfreemem(bytes);
    return decoded;
}

// A stored stream replayed: its chunks, cut from the body at the stored lengths.
BodyStream replayed_stream(const std::string& body, const std::string& lengths) {
    auto chunks = std::make_shared<std::vector<std::string>>(split_chunks(body, lengths));
    return [chunks](ChunkSink& sink) {
        for (const std::string& chunk : *chunks)
            if (!chunk.empty() && !sink.write(chunk)) return;  // an empty one would end it
    };
}

}  // namespace

std::optional<Response> answer_of(const ColumnReader& column) {
    const std::optional<std::string> status = column("status");
    if (!status) return std::nullopt;
    Response response;
    response.status = std::stoi(*status);
    response.body = unescape_bytea(column("body").value_or(""));
    response.resource_id = column("resource_id");
    std::optional<std::string> chunks;
    for (const auto& pair : nlohmann::json::parse(column("headers").value_or("[]"))) {
        const std::string name = pair.at(0).get<std::string>();
        std::string value = pair.at(1).get<std::string>();
        if (header_name_equal(name, stream_chunks_entry))
            chunks = std::move(value);
        else if (name.empty() || name[0] != ':')
            response.headers.emplace_back(name, std::move(value));
    }
    response.replayed = response.header(replay_header) != nullptr;
    if (chunks) {
        response.stream = replayed_stream(response.body, *chunks);
        response.body.clear();
    }
    return response;
}

std::optional<long long> expiry_of(const ColumnReader& column) {
    const std::optional<std::string> epoch = column("expires_epoch");
    if (!epoch) return std::nullopt;
    return std::stoll(*epoch);
}

std::optional<long long> stored_expiry(pqxx::transaction_base& tx, const std::string& principal,
                                       const std::string& key) {
    const pqxx::result rows = pq::exec(tx,
                                       "SELECT floor(extract(epoch FROM expires_at))::bigint"
                                       " AS expires_epoch FROM idempotency.lookup($1, $2)",
                                       principal, key);
    if (rows.empty()) return std::nullopt;
    return expiry_of(columns_of(rows[0]));
}

Response stamped(Response response, std::optional<long long> expires_epoch) {
    if (expires_epoch) response.set_header(expires_header, http_date(*expires_epoch));
    return response;
}

KeyCall key_call(const Request& request, const std::string& key, const Digest& digest,
                 const KeyOptions& options) {
    KeyCall call{
        request.principal,
        key,
        request.action.empty() ? upper(request.method) + " " + request.path : request.action,
        std::string(reinterpret_cast<const char*>(digest.data()), digest.size()),
        std::nullopt,
        std::nullopt};
    if (options.ttl) call.ttl = std::to_string(options.ttl->count()) + " seconds";
    if (options.wait) call.wait = interval_ms(*options.wait);
    if (request.duplicates.value_or(options.duplicates) == Duplicates::reject)
        call.wait = interval_ms(std::chrono::milliseconds(0));  // 409 at once, no waiting
    return call;
}

std::string interval_ms(std::chrono::milliseconds value) {
    return std::to_string(value.count()) + " milliseconds";
}

}  // namespace detail

}  // namespace idem
