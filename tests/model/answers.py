"""The checks of what a call answered and of a key row read directly (I2, I3,
I4, I7 and BIND), for Model (model.py): a mixin, so that they share Model's
lock, ops and certain-current-generation rules."""


class AnswerChecks:
    """check_answer and check_row of Model; self is the Model."""

    def check_answer(self, op, outcome, status, headers, body, resource_id, fence):
        """I2/I7/I4: a replay, secret_replay or mismatch answered to `op` must come
        from a generation that may have committed, for this key, with the
        fingerprint (same or other) the outcome says, its exact bytes, and the
        fence that generation was handed; and it must be the current one."""
        with self.lock:
            key = op.key_id()
            writer_id = resource_id
            if writer_id is None and body is not None:
                writer_id = parse_body_id(body)
            writer = self.ops.get(writer_id) if writer_id is not None else None
            current = self.certain_current(key, op)
            if outcome == "mismatch":
                if current is not None and current.fp == op.fp and self.certainly_live(
                        current, op.now, op.clock, op.sent):
                    self.violation("I7", key, "%s answered mismatch although the live row of %s has the same "
                                   "fingerprint %s" % (op.id, current.id, op.fp), [current, op])
                if writer is not None and writer.kind == "txn" and writer.fp == op.fp:
                    self.violation("I7", key, "%s answered mismatch naming %s, which has the same fingerprint"
                                   % (op.id, writer.id), [writer, op])
                return
            # replay / secret_replay
            if writer is None:
                if current is not None and current.kind == "claim" and op.fp != "claim":
                    self.violation("I2", key, "%s got %s from a claim row (fingerprint differs)" % (op.id, outcome),
                                   [current, op])
                return  # a claim or a save_final without a body: nothing to compare
            if writer.key_id() != key:
                self.violation("I2", key, "%s replayed the response of %s, which is for another key %s"
                               % (op.id, writer.id, writer.key_id()), [writer, op])
                return
            if writer.commit == "no":
                self.violation("I4", key, "%s replayed the response of %s, whose transaction did not commit"
                               % (op.id, writer.id), [writer, op])
                return
            gen = writer.holder if writer.kind == "complete" else writer
            if gen is None:
                return  # a complete with a fence taken from another key's holder (--roles): BIND flags it
            if gen.fp != op.fp:
                self.violation("I7", key, "%s (fingerprint %s) got %s of %s, whose fingerprint is %s"
                               % (op.id, op.fp, outcome, gen.id, gen.fp), [gen, op])
                return
            stored = writer.response + (writer.secret,) if writer.response else None
            if stored is None:
                self.violation("I2", key, "%s replayed a response %s never stored" % (op.id, writer.id),
                               [writer, op])
                return
            if outcome == "secret_replay":
                if not stored[3]:
                    self.violation("I2", key, "%s got secret_replay but %s stored a plain response"
                                   % (op.id, writer.id), [writer, op])
                elif status != stored[0]:
                    self.violation("I2", key, "%s got secret_replay with status %s, %s stored %s"
                                   % (op.id, status, writer.id, stored[0]), [writer, op])
            else:
                if stored[3]:
                    self.violation("I2", key, "%s got replay of %s, which was a one-time secret"
                                   % (op.id, writer.id), [writer, op])
                elif (status, headers, body) != stored[:3]:
                    self.violation("I2", key, "%s replayed (%s, %s, %r) but %s stored (%s, %s, %r)"
                                   % (op.id, status, headers, body, writer.id, stored[0], stored[1], stored[2]),
                                   [writer, op])
            if gen.fence is not None and fence is not None and fence != gen.fence:
                self.violation("I3", key, "%s: the stored row of %s carries fence %s, but %s was handed fence %s"
                               % (op.id, gen.id, fence, gen.id, gen.fence), [gen, op],
                               "stored fence differs from the one handed out")
            if current is not None and current is not gen:
                self.violation("I2", key, "%s replayed %s although %s had replaced it before the call"
                               % (op.id, gen.id, current.id), [gen, current, op], "stale replay")

    def check_row(self, op, row):
        """I4/I3: a key row read directly (inspect, end of run) must have been
        written by an op that may have committed, with the fence that op was
        handed and the response it stored; a certainly live current generation
        must be the row."""
        with self.lock:
            key = op.key_id()
            current = self.certain_current(key, op)
            live_current = current is not None and self.certainly_live(current, op.now, op.clock, op.sent)
            if row is None:
                if live_current:
                    self.violation("I4", key, "%s: no row, but %s committed it and it is still live"
                                   % (op.id, current.id), [current, op], "live row deleted")
                return
            writer_id = row["action"].split(":", 1)[1] if ":" in row["action"] else None
            writer = self.ops.get(writer_id) if writer_id else None
            if writer is None:
                if row["action"] != "claim":
                    self.violation("I4", key, "%s: row with action %r written by no op of this run"
                                   % (op.id, row["action"]), [op])
                return
            if writer.role is not None and writer.role != key[0]:
                self.violation("BIND", key, "%s: the row of principal %s was written by %s as role %s (path %s)"
                               % (op.id, key[0], writer.id, writer.role, writer.path), [writer, op],
                               "row of a principal written by another role")
            if writer.commit == "no":
                self.violation("I4", key, "%s: the row was written by %s, whose transaction did not commit"
                               % (op.id, writer.id), [writer, op])
                return
            if writer.fence is not None and row["fence"] != writer.fence:
                self.violation("I3", key, "%s: the row of %s carries fence %s, but %s was handed fence %s"
                               % (op.id, writer.id, row["fence"], writer.id, writer.fence), [writer, op],
                               "stored fence differs from the one handed out")
            if live_current and current is not writer:
                self.violation("I4", key, "%s: the row is %s's, but %s committed after it and is still live"
                               % (op.id, writer.id, current.id), [current, writer, op])
            if row["state"] == "completed":
                if writer.kind == "acquire":
                    done = [c for c in writer.completed_by if c.commit != "no" and c.outcome is not False]
                    if not done:
                        self.violation("I4", key, "%s: the lease row of %s is completed, but no complete of "
                                       "that holder may have committed" % (op.id, writer.id), [writer, op])
                        return
                    stored = done[-1].response
                    secret = done[-1].secret
                else:
                    stored, secret = writer.response, writer.secret
                if stored is not None and not secret:
                    got = (row["status"], row["headers"], row["body"])
                    if got != stored:
                        self.violation("I2", key, "%s: the row holds (%s, %s, %r) but %s stored (%s, %s, %r)"
                                       % (op.id, got[0], got[1], got[2], writer.id, stored[0], stored[1],
                                          stored[2]), [writer, op])


def parse_body_id(body):
    """The op id a response body names (bodies are b'op=<id>;...')."""
    if body is None or not body.startswith(b"op="):
        return None
    end = body.find(b";")
    return body[3:end].decode("ascii", "replace") if end > 0 else None
