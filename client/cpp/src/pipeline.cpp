#include "pipeline.hpp"

#include <climits>
#include <cstring>
#include <stdexcept>

namespace idem::detail {

namespace {

constexpr Oid bytea_oid = 17;           // pg_type.oid of bytea, fixed in every PostgreSQL
constexpr std::size_t kMaxParams = 16;  // the protocol's statements have at most 8

pqxx::broken_connection connection_failure(PGconn* connection, const char* doing) {
    return pqxx::broken_connection(std::string(doing) + ": " + PQerrorMessage(connection));
}

bool succeeded(const PGresult* result) {
    const ExecStatusType status = PQresultStatus(result);
    return status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;
}

// Ends a transaction block the server holds after a failed statement, so the
// connection is idle for the next transaction whatever happens here.
void rollback_quietly(PGconn* connection) noexcept {
    if (PQstatus(connection) != CONNECTION_OK || PQtransactionStatus(connection) == PQTRANS_IDLE)
        return;
    PQclear(PQexec(connection, "ROLLBACK"));
}

}  // namespace

std::vector<ResultPtr> run_pipeline(PGconn* connection,
                                    std::initializer_list<const Statement*> statements) {
    if (connection == nullptr || PQstatus(connection) != CONNECTION_OK)
        throw pqxx::broken_connection("the connection is not open");
    // Checked before anything is sent: a throw half way would leave the
    // connection in pipeline mode with statements queued.
    for (const Statement* statement : statements) {
        if (statement->params.size() > kMaxParams)
            throw std::length_error("a statement has too many parameters");
        for (const Param& param : statement->params)
            if (param.value && param.value->size() > static_cast<std::size_t>(INT_MAX))
                throw std::length_error("a statement parameter is larger than 2 GiB");
    }
    if (PQenterPipelineMode(connection) != 1)
        throw connection_failure(connection, "cannot enter pipeline mode");

    std::vector<ResultPtr> results;
    results.reserve(statements.size());
    for (const Statement* statement_pointer : statements) {
        const Statement& statement = *statement_pointer;
        const std::size_t n = statement.params.size();
        Oid types[kMaxParams] = {};
        const char* values[kMaxParams] = {};
        int lengths[kMaxParams] = {};
        int formats[kMaxParams] = {};
        for (std::size_t i = 0; i < n; ++i) {
            const Param& param = statement.params[i];
            if (!param.value) continue;  // NULL
            values[i] = param.value->data();
            lengths[i] = static_cast<int>(param.value->size());
            if (param.binary) {
                types[i] = bytea_oid;
                formats[i] = 1;
            }
        }
        int sent = 0;
        if (statement.name == nullptr) {
            sent = PQsendQueryParams(connection, statement.sql, static_cast<int>(n), types, values,
                                     lengths, formats, 0);
        } else {
            sent = PQsendQueryPrepared(connection, statement.name, static_cast<int>(n), values,
                                       lengths, formats, 0);
        }
        if (sent != 1) throw connection_failure(connection, "cannot send a statement");
    }
    if (PQpipelineSync(connection) != 1)
        throw connection_failure(connection, "cannot send the pipeline");

    for (std::size_t i = 0; i < statements.size(); ++i) {
        ResultPtr result(PQgetResult(connection));
        if (!result || PQstatus(connection) != CONNECTION_OK)
            throw connection_failure(connection, "connection lost in a pipeline");
        // Each statement's results end with a null; there is exactly one result
        // before it because every statement here is a single command.
        while (PGresult* extra = PQgetResult(connection)) PQclear(extra);
        results.push_back(std::move(result));
    }
    ResultPtr sync(PQgetResult(connection));
    if (!sync || PQresultStatus(sync.get()) != PGRES_PIPELINE_SYNC)
        throw connection_failure(connection, "connection lost at the end of a pipeline");
    if (PQexitPipelineMode(connection) != 1)
        throw connection_failure(connection, "cannot leave pipeline mode");
    return results;
}

void prepare(PGconn* connection, const Statement& statement) {
    std::vector<Oid> types(statement.params.size(), 0);
    for (std::size_t i = 0; i < types.size(); ++i)
        if (statement.params[i].binary) types[i] = bytea_oid;
    ResultPtr result(PQprepare(connection, statement.name, statement.sql,
                               static_cast<int>(types.size()), types.data()));
    if (!result) throw connection_failure(connection, "cannot prepare a statement");
    const char* state = PQresultErrorField(result.get(), PG_DIAG_SQLSTATE);
    if (state != nullptr && std::strcmp(state, "42P05") == 0)
        return;  // duplicate_prepared_statement
    throw_if_failed(result.get(), statement.sql);
}

void throw_if_failed(const PGresult* result, const char* sql) {
    if (succeeded(result)) return;
    const std::string query = sql != nullptr ? sql : "";
    if (PQresultStatus(result) == PGRES_PIPELINE_ABORTED)
        throw pqxx::sql_error("not executed: an earlier statement of the same round trip failed",
                              query);
    const std::string message = PQresultErrorMessage(result);
    const char* state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
    if (state == nullptr) throw pqxx::broken_connection(message);
    if (std::strcmp(state, "40001") == 0)
        throw pq::error<pqxx::serialization_failure>(message, query, state);
    if (std::strcmp(state, "40P01") == 0)
        throw pq::error<pqxx::deadlock_detected>(message, query, state);
    if (std::strcmp(state, "40003") == 0)
        throw pq::error<pqxx::statement_completion_unknown>(message, query, state);
    throw pqxx::sql_error(message, query, state);
}

#if PQXX_VERSION_MAJOR < 7
PipelinedTransaction::PipelinedTransaction(PqxxConnection& connection, PGconn* raw,
                                           const Statement& first)
    : pqxx::internal::namedclass("idem::PipelinedTransaction"),
      pqxx::internal::basic_transaction(
          connection, pqxx::isolation_traits<pqxx::read_committed>::name(), pqxx::read_write),
      raw_(raw),
      first_(&first) {
    Begin();  // runs do_begin(); on failure unregisters and rethrows
    first_ = nullptr;
}

PipelinedTransaction::~PipelinedTransaction() noexcept { End(); }
#else
PipelinedTransaction::PipelinedTransaction(PqxxConnection& connection, PGconn* raw,
                                           const Statement& first)
    : pqxx::transaction_base(connection, "idempotency"), raw_(raw), first_(&first) {
    register_transaction();
    try {
        begin_pipelined();
    } catch (...) {
        set_rollback_cmd(nullptr);  // the block is closed already: close() sends nothing
        close();
        throw;
    }
    first_ = nullptr;
}

PipelinedTransaction::~PipelinedTransaction() noexcept { close(); }
#endif

void PipelinedTransaction::begin_pipelined() {
    static const Statement begin{"BEGIN", {}};
    std::vector<ResultPtr> results = run_pipeline(raw_, {&begin, first_});
    throw_if_failed(results[0].get(), "BEGIN");
    if (!succeeded(results[1].get())) {
        rollback_quietly(raw_);
        throw_if_failed(results[1].get(), first_->sql);
    }
    first_result_ = std::move(results[1]);
}

void PipelinedTransaction::commit_with(const Statement& last) {
    last_ = &last;
    try {
        commit();
    } catch (...) {
        last_ = nullptr;
        throw;
    }
    last_ = nullptr;
}

void PipelinedTransaction::commit_pipelined() {
    static const Statement commit_statement{"COMMIT", {}};
    std::vector<ResultPtr> results;
    try {
        results = last_ != nullptr ? run_pipeline(raw_, {last_, &commit_statement})
                                   : run_pipeline(raw_, {&commit_statement});
    } catch (const pqxx::broken_connection& e) {
        // COMMIT may or may not have run: never let the caller retry the effect.
        throw pqxx::in_doubt_error(
            std::string("connection lost while committing; the transaction may have "
                        "committed or not (check before repeating it): ") +
            e.what());
    }
    if (last_ != nullptr && !succeeded(results[0].get())) {
        rollback_quietly(raw_);  // COMMIT was skipped: the block is still open, and failed
        throw_if_failed(results[0].get(), last_->sql);
    }
    const PGresult* commit = results.back().get();
    if (succeeded(commit) &&
        std::strcmp(PQcmdStatus(const_cast<PGresult*>(commit)), "ROLLBACK") == 0)
        throw pqxx::sql_error(
            "COMMIT rolled back: an earlier statement of the transaction had failed", "COMMIT",
            "25P02");
    const char* state = PQresultErrorField(commit, PG_DIAG_SQLSTATE);
    if (state != nullptr && std::strcmp(state, "40003") == 0)
        throw pqxx::in_doubt_error(std::string("the outcome of COMMIT is unknown: ") +
                                   PQresultErrorMessage(commit));
    throw_if_failed(commit, "COMMIT");  // a failed COMMIT ends the block on the server
}

}  // namespace idem::detail
