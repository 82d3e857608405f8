// idem::Connection for each libpqxx version. libpqxx 6 connects through a
// connection policy that records the libpq handle each time libpqxx opens,
// reopens or closes it; libpqxx 7 and 8 (whose pqxx::connection is final in 8)
// take over a libpq connection opened here, whose handle is then known.
#include "idem/connection.hpp"

#include <new>

#include "pqxx_compat.hpp"

namespace idem {

#if PQXX_VERSION_MAJOR < 7

namespace {

/// Connects like pqxx::connection (connect_direct) and remembers the libpq handle.
class RecordingPolicy : public pqxx::connect_direct {
public:
    explicit RecordingPolicy(const std::string& options) : pqxx::connect_direct(options) {}
    handle do_startconnect(handle orig) override {
        return handle_ = pqxx::connect_direct::do_startconnect(orig);
    }
    handle do_completeconnect(handle orig) override {
        return handle_ = pqxx::connect_direct::do_completeconnect(orig);
    }
    handle do_dropconnect(handle orig) noexcept override {
        return handle_ = pqxx::connect_direct::do_dropconnect(orig);
    }
    handle do_disconnect(handle orig) noexcept override {
        return handle_ = pqxx::connect_direct::do_disconnect(orig);
    }
    /// The libpq connection libpqxx currently uses (null when closed).
    handle current() const noexcept { return handle_; }

private:
    handle handle_ = nullptr;
};

/// A pqxx::connection_base over a RecordingPolicy.
class RecordingConnection : public pqxx::connection_base {
public:
    explicit RecordingConnection(const std::string& options)
        : pqxx::connection_base(policy_), policy_(options) {
        init();
    }
    ~RecordingConnection() noexcept { close(); }
    PGconn* raw() const noexcept { return policy_.current(); }

private:
    RecordingPolicy policy_;
};

}  // namespace

struct Connection::State {
    explicit State(const std::string& options) : connection(options) {}
    RecordingConnection connection;
    PGconn* raw() const noexcept { return connection.raw(); }
};

#else

namespace {

/// Opens a libpq connection; throws pqxx::broken_connection when it fails.
PGconn* open(const std::string& options) {
    PGconn* raw = PQconnectdb(options.c_str());
    if (raw == nullptr) throw std::bad_alloc();
    if (PQstatus(raw) != CONNECTION_OK) {
        const std::string message = PQerrorMessage(raw);
        PQfinish(raw);
        throw pqxx::broken_connection(message);
    }
    return raw;
}

}  // namespace

struct Connection::State {
    explicit State(const std::string& options)
        : handle(open(options)), connection(pqxx::connection::seize_raw_connection(handle)) {}
    PGconn* handle;  // owned by `connection`, which closes it
    pqxx::connection connection;
    PGconn* raw() const noexcept { return connection.is_open() ? handle : nullptr; }
};

#endif

Connection::Connection(const std::string& options) : state_(std::make_unique<State>(options)) {}

Connection::~Connection() noexcept = default;

PqxxConnection& Connection::connection() noexcept { return state_->connection; }

PGconn* Connection::raw_connection() const noexcept { return state_->raw(); }

}  // namespace idem
