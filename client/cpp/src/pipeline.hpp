// libpq pipeline mode under a libpqxx transaction: BEGIN travels with the first
// statement and the last statement with COMMIT. Private to the library.
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include "idem/connection.hpp"
#include "pqxx_compat.hpp"

namespace idem::detail {

/// One parameter of a statement: absent means SQL NULL; `binary` sends the bytes
/// as bytea in binary format, anything else goes as text for the server to cast.
/// Make them with the functions below: libpq reads text values up to their NUL.
struct Param {
    std::optional<std::string_view> value;
    bool binary = false;

    /// A text value (std::string: NUL-terminated, as libpq needs).
    static Param text(const std::string& value) { return Param{std::string_view(value), false}; }
    /// Not from a temporary: the statement only points at the text.
    static Param text(std::string&&) = delete;
    /// A text value, or SQL NULL when it is empty.
    static Param text(const std::optional<std::string>& value) {
        return value ? text(*value) : Param{};
    }
    /// A bytea value, sent in binary format (any bytes).
    static Param bytes(std::string_view value) { return Param{value, true}; }
    /// SQL NULL.
    static Param null() { return Param{}; }
};

/// A parameterized statement (text and parameters stay owned by the caller).
struct Statement {
    /// The statement text (also the definition when `prepare` is set).
    const char* sql = nullptr;
    std::vector<Param> params;
    /// When set, the statement is executed as this named prepared statement
    /// (see prepare()).
    const char* name = nullptr;
};

/// Prepares `statement` under its name on the raw connection (one round trip,
/// outside any transaction), with the parameter types run_pipeline() sends.
/// A statement of that name that exists already counts as prepared.
void prepare(PGconn* connection, const Statement& statement);

/// Frees a PGresult.
struct ResultDeleter {
    void operator()(PGresult* result) const noexcept { PQclear(result); }
};
/// An owned libpq result.
using ResultPtr = std::unique_ptr<PGresult, ResultDeleter>;

/// Sends `statements` in pipeline mode followed by one Sync (one round trip) and
/// returns one result per statement. Statements after a failed one come back as
/// PGRES_PIPELINE_ABORTED. Throws pqxx::broken_connection when the connection
/// fails on the way (nothing is known then about what ran).
std::vector<ResultPtr> run_pipeline(PGconn* connection,
                                    std::initializer_list<const Statement*> statements);

/// Throws the libpqxx exception for a failed result, as libpqxx would for the
/// same SQLSTATE (serialization_failure for 40001, deadlock_detected for 40P01,
/// statement_completion_unknown for 40003, sql_error otherwise); returns when
/// the result is a success.
void throw_if_failed(const PGresult* result, const char* sql);

/// A read-committed pqxx transaction whose BEGIN carries the first statement and
/// whose COMMIT can carry a last one, both in libpq pipeline mode on the raw
/// connection of the same session. Every other statement runs through libpqxx
/// as usual, so a handler sees an ordinary pqxx::transaction_base. (libpqxx 6
/// lets a basic_transaction send its own BEGIN; with 7 and 8 the class is a
/// transaction_base that sends BEGIN itself, as nontransaction sends none.)
#if PQXX_VERSION_MAJOR < 7
class PipelinedTransaction final : public pqxx::internal::basic_transaction {
#else
class PipelinedTransaction final : public pqxx::transaction_base {
#endif
public:
    /// Sends BEGIN and `first` in one round trip. When `first` fails the
    /// transaction is rolled back and its exception thrown.
    PipelinedTransaction(PqxxConnection& connection, PGconn* raw, const Statement& first);
    ~PipelinedTransaction() noexcept override;

    /// The first statement's result (PGRES_TUPLES_OK or PGRES_COMMAND_OK).
    const PGresult* first_result() const noexcept { return first_result_.get(); }

    /// Commits with `last` executed just before COMMIT, in one round trip. When
    /// `last` fails the transaction is rolled back and its exception thrown; when
    /// the connection fails on the way, pqxx::in_doubt_error.
    void commit_with(const Statement& last);

private:
    /// BEGIN + the first statement (in the constructor).
    void begin_pipelined();
    /// The last statement (if any) + COMMIT (in commit()).
    void commit_pipelined();
#if PQXX_VERSION_MAJOR < 7
    void do_begin() override { begin_pipelined(); }
    void do_commit() override { commit_pipelined(); }
#elif PQXX_VERSION_MAJOR < 8
    void do_commit() override { commit_pipelined(); }
#else
void do_commit(pqxx::sl) override { commit_pipelined(); }
#endif

    PGconn* raw_;
    const Statement* first_;
    const Statement* last_ = nullptr;
    ResultPtr first_result_;
};

}  // namespace idem::detail
