// idempotency.routed and the planner hook behind it.
//
// Citus plans a prepared call of a distributed function with parameters again
// at every execution: it marks the call's generic plan too costly to be chosen
// (it must see the argument to delegate the call to the node of its shard). On
// the node that holds the shard there is nothing to delegate, and a router
// sends each request there; the planning at every call is then pure cost (the
// routed key cost up to 2.4x one node's key in issue 40's runs). A session
// with idempotency.routed on plans the generic plan of such a call - a call of
// a function of the idempotency schema, alone in a SELECT, with an argument
// that is a parameter - with PostgreSQL's own planner, which is what Citus's
// planner returns for it less the cost mark; every other statement, and every
// custom plan, goes through the planner hooks as before. A generic plan runs
// the call here: where the shard is not here, the call refuses as a stale
// placement (placement.cpp) instead of being delegated.
#include "routed.hpp"

extern "C" {
#include "postgres.h"

#include "catalog/namespace.h"
#include "nodes/nodeFuncs.h"
#include "nodes/parsenodes.h"
#include "optimizer/planner.h"
#include "parser/parsetree.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
}

namespace idem::pg {

bool routed = false;

namespace {

planner_hook_type previous_planner = nullptr;

// Whether `node` holds a parameter of the statement ($n).
bool has_extern_param(Node* node, void*) {
    if (node == nullptr) return false;
    if (IsA(node, Param)) return castNode(Param, node)->paramkind == PARAM_EXTERN;
#if PG_VERSION_NUM >= 160000
    return expression_tree_walker(node, has_extern_param, nullptr);
#else
    // PostgreSQL 15 declares the walker without arguments; through void(*)()
    // the cast is the one the compiler accepts as deliberate.
    return expression_tree_walker(
        node, reinterpret_cast<bool (*)()>(reinterpret_cast<void (*)()>(has_extern_param)),
        nullptr);
#endif
}

// The call of `parse` as Citus would delegate it: SELECT f(...) or
// SELECT ... FROM f(...), nothing else in the statement; nullptr otherwise.
FuncExpr* lone_call(Query* parse) {
    if (parse->commandType != CMD_SELECT || parse->utilityStmt != nullptr ||
        parse->cteList != NIL || parse->hasSubLinks || parse->setOperations != nullptr ||
        parse->jointree == nullptr || parse->jointree->quals != nullptr)
        return nullptr;
    List* from = parse->jointree->fromlist;
    if (from == NIL) {
        if (parse->rtable != NIL || list_length(parse->targetList) != 1) return nullptr;
        Expr* expr = linitial_node(TargetEntry, parse->targetList)->expr;
        return IsA(expr, FuncExpr) ? reinterpret_cast<FuncExpr*>(expr) : nullptr;
    }
    if (list_length(from) != 1 || list_length(parse->rtable) != 1 ||
        !IsA(linitial(from), RangeTblRef))
        return nullptr;
    RangeTblEntry* rte = rt_fetch(castNode(RangeTblRef, linitial(from))->rtindex, parse->rtable);
    if (rte->rtekind != RTE_FUNCTION || list_length(rte->functions) != 1) return nullptr;
    Node* call = linitial_node(RangeTblFunction, rte->functions)->funcexpr;
    return IsA(call, FuncExpr) ? reinterpret_cast<FuncExpr*>(call) : nullptr;
}

// A generic plan (no bound parameters) of a lone call of a function of the
// idempotency schema with a parameter among its arguments.
bool routed_protocol_call(Query* parse, ParamListInfo bound) {
    if (bound != nullptr) return false;
    FuncExpr* call = lone_call(parse);
    if (call == nullptr) return false;
    const Oid schema = get_namespace_oid("idempotency", true);
    return OidIsValid(schema) && get_func_namespace(call->funcid) == schema &&
           has_extern_param(reinterpret_cast<Node*>(call->args), nullptr);
}

PlannedStmt* plan(Query* parse, const char* query_string, int cursor_options, ParamListInfo bound) {
    if (routed && routed_protocol_call(parse, bound))
        return standard_planner(parse, query_string, cursor_options, bound);
    if (previous_planner != nullptr)
        return previous_planner(parse, query_string, cursor_options, bound);
    return standard_planner(parse, query_string, cursor_options, bound);
}

}  // namespace

void routed_init() {
    DefineCustomBoolVariable(
        "idempotency.routed",
        "Whether this session was routed to the node that holds its principals' shards.",
        "on (Citus, on a router's connections to the workers): a prepared call of a protocol "
        "function keeps one plan and runs on this node; a call whose shard is elsewhere is "
        "refused as a stale placement (0A000) instead of delegated.",
        &routed, false, PGC_USERSET, 0, nullptr, nullptr, nullptr);
    previous_planner = planner_hook;
    planner_hook = plan;
}

}  // namespace idem::pg
