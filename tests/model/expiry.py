"""Invariant EXP (--refuse): with the expiry policy `refuse`, no key runs again
within ttl + grace, and only such a key answers `expired`; and (under either policy) no fenced
completion succeeds once its key is dead, which would revive a key that had
already answered `expired` or could start again (0.8.0 allowed it).

A request whose action refuses (Op.refuse_grace, seconds) sets the policy in its
own transaction (transport_direct.py), so the policy commits with its key row.
Its generation then refuses every start under the key from its expiry until
expiry + grace: before cleanup reaches the row (the server reads the policy),
and after (the tombstone). The checks use only what is certain, as model.py's
do: the key's certain current generation and a margin on every time.
"""

def refused_window(model, gen, moment):
    """(from, to) in server time while `gen`'s action certainly refuses a new
    start under its key (expired, within its grace), or None: the generation
    does not refuse, or its expiry is not certain (a lease generation whose
    complete may have moved it)."""
    if gen.refuse_grace is None or gen.expires is None:
        return None
    if gen.kind == "acquire" and model.completed(gen, moment) != "no":
        return None
    return gen.expires + model.margin, gen.expires + gen.refuse_grace - model.margin


def check_refused(model, op, current):
    """A start (begin/acquire started, save_final/claim true) on a key whose
    certain current generation's action refuses it: the key had expired and
    its grace had not run out when the server decided (op.now)."""
    if current is None or op.now is None:
        return
    window = refused_window(model, current, op.sent)
    if window is not None and window[0] < op.now < window[1]:
        model.violation(
            "EXP", op.key_id(),
            "%s answered %s %.3f s after %s's key expired, within its grace of %.3f s (expired expected)"
            % (op.id, op.outcome, op.now - current.expires, current.id, current.refuse_grace),
            [current, op], "%s ran again within ttl + grace" % op.kind)


def check_expired(model, op):
    """`expired` answered to `op` while the key's certain current generation was
    certainly live by its ttl, or belongs to an action without a refuse policy."""
    current = model.certain_current(op.key_id(), op)
    if current is None:
        return
    if current.refuse_grace is None:
        model.violation("EXP", op.key_id(), "%s answered expired, but %s's action has no refuse policy"
                        % (op.id, current.id), [current, op], "expired without a refuse policy")
    elif model.unexpired(current, op.now, op.clock):
        model.violation("EXP", op.key_id(), "%s answered expired while %s was live by its ttl"
                        % (op.id, current.id), [current, op], "expired while live")


def latest_lease(gen):
    """The latest moment (server clock) that `gen`'s lease can have reached:
    the acquire's lease_until, or a renewal's clock_timestamp() after the call
    plus its lease. None when a renewal's outcome or time is not known."""
    latest = gen.lease_min
    for renewal in gen.renewed_by:
        if renewal.outcome is False:
            continue
        if renewal.clock is None:
            return None
        latest = max(latest, renewal.clock + renewal.params["lease_s"])
    return latest


def check_late_complete(model, op):
    """A complete(fence) `op` that answered true although, when it was sent,
    its holder's row was certainly dead: the ttl ran out and so did every lease
    it could have had. renew() refuses such a row; complete() must as well."""
    holder = op.holder
    if holder is None or holder.expires is None or holder.lease_min is None:
        return
    lease = latest_lease(holder)
    if lease is None or op.sent is None:
        return
    if holder.expires + model.margin < op.sent and lease + model.margin < op.sent:
        name = "EXP" if holder.refuse_grace is not None else "I3"
        model.violation(
            name, op.key_id(),
            "%s(fence %s) returned true %.3f s after %s's ttl and %.3f s after its last lease ran out"
            % (op.kind, op.fence, op.sent - holder.expires, holder.id, op.sent - lease),
            [holder, op], "a late fenced completion revived a dead key")
