"""The lease operation of a model client (acquire, the external effect,
renew(s), then complete, release or abandon), for Client (workload.py): a
mixin, so that it shares the client's random stream, transport and checks."""

import time

from values import epoch


class LeaseOps:
    """op_lease and its steps; self is the Client."""

    def op_lease(self):
        """acquire -> record the external effect -> renew(s) -> complete(fence), release or abandon."""
        principal, key = self.draw_key()
        fp = self.rng.randrange(self.settings.fingerprints)
        ttl, lease = self.draw_ttl_lease()
        wait = self.rng.choice([0, 0.02, 0.1])
        acq = self.new_op("acquire", principal, key, fp)
        acq.params = {"ttl": ttl, "lease": lease, "wait": wait}
        self.draw_refuse(acq)
        row = self.send(acq, "acquire", principal, key, fp, lease, ttl, wait, self.draw_isolation())
        if row is None:
            return
        outcome, status, headers, body, resource_id, expires, fence, lease_until, now, clock = row[:10]
        acq.outcome = outcome
        acq.now, acq.clock = epoch(now), epoch(clock)
        acq.writes = outcome == "started"
        if outcome != "started":
            if outcome in ("replay", "secret_replay", "mismatch"):
                self.model.check_answer(acq, outcome, status, headers, body and bytes(body), resource_id, fence)
            elif outcome == "expired":
                self.model.check_expired(acq)
            elif outcome == "in_progress" and not self.check_usable(acq, row):
                return
            self.settle(acq)
            return
        acq.fence, acq.expires, acq.lease_min = fence, epoch(expires), lease_until
        acq.holds_lock = True  # until its COMMIT (commit_sent)
        self.model.check_start(acq)
        self.settle(acq)
        if acq.commit != "yes":
            return
        # The external effect, recorded in a transaction of its own.
        effect = self.new_op("effect", principal, key, fp)
        effect.holder, effect.fence = acq, fence
        if self.send(effect, "lease_effect", principal, key, fence, acq.id) is not None:
            self.settle(effect)
        for _ in range(self.rng.choice([0, 0, 1, 1, 2, 3])):
            # Work between renewals; sometimes a stall past the lease.
            time.sleep(lease * self.rng.choice([0.2, 0.3, 0.5, 0.8, 1.3]))
            if not self.renew(acq, principal, key, fp, fence, lease):
                break
        time.sleep(lease * self.rng.choice([0.1, 0.3, 0.6, 1.2]))
        self.lease_end(acq, principal, key, fp, fence)

    def renew(self, acq, principal, key, fp, fence, lease):
        """One renew of holder `acq`; whether it renewed."""
        renewal = self.new_op("renew", principal, key, fp)
        renewal.holder, renewal.fence = acq, fence
        renewal.params = {"lease_s": lease}
        with self.model.lock:
            acq.renewed_by.append(renewal)
        row = self.send(renewal, "renew", principal, key, fence, lease, self.draw_isolation())
        if row is None:
            return False
        now, renewed, clock = row
        renewal.outcome = renewed
        renewal.now, renewal.clock = epoch(now), epoch(clock)
        if renewed:
            self.model.check_fenced_success(renewal)
        self.settle(renewal)
        return bool(renewed)

    def lease_end(self, acq, principal, key, fp, fence):
        """The end of a lease: complete(fence), release, or walk away."""
        last = self.pick({"complete": 60, "release": 25, "abandon": 15})
        if last == "abandon":
            acq.note = "abandoned"
            return
        done = self.new_op(last, principal, key, fp)
        done.holder, done.fence = acq, fence
        with self.model.lock:
            (acq.completed_by if last == "complete" else acq.released_by).append(done)
        if last == "complete":
            secret = self.rng.random() < 0.1
            status, headers, body = self.response(done, [200, 201, 402, 404, 409, 500])
            done.secret = secret
            done.response = (status, None, None) if secret else (status, headers, body)
            done.params = {"status": status}
            row = self.send(done, "complete_fenced", principal, key, fence, status, headers, body, secret,
                            self.draw_isolation())
        else:
            row = self.send(done, "release", principal, key, fence, self.draw_isolation())
        if row is None:
            return
        done.outcome = row[0]
        if done.outcome:
            self.model.check_fenced_success(done)
            if last == "complete":
                self.model.check_late_complete(done)
        if self.fault("disconnect") and self.transport.abandon(done):
            self.count_fault()
            done.note = "disconnect fault before COMMIT"
            return
        self.settle(done)
        if last == "complete" and done.outcome is True and done.commit == "yes" and self.rng.random() < 0.15:
            self.complete_again(acq, principal, key, fp, fence)

    def complete_again(self, acq, principal, key, fp, fence):
        """I1: a lease generation completes at most once; a second complete with
        the same fence must answer false and change nothing."""
        again = self.new_op("complete", principal, key, fp)
        again.holder, again.fence = acq, fence
        status, headers, body = self.response(again, [200, 201])
        again.response = (status, headers, body)
        again.note = "second complete of one generation"
        row = self.send(again, "complete_fenced", principal, key, fence, status, headers, body, False,
                        self.draw_isolation())
        if row is None:
            return
        again.outcome = row[0]
        if again.outcome:
            self.model.violation("I1", again.key_id(), "%s: a second complete(fence %s) of %s answered true: "
                                 "a lease generation completed twice" % (again.id, fence, acq.id), [acq, again],
                                 "lease generation completed twice")
            with self.model.lock:
                acq.completed_by.append(again)
        self.settle(again)
