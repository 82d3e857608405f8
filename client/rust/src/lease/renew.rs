//! The renewal of a lease: a task renews every third of the lease while the body runs.
//!
//! The tasks run on a runtime of their own (one worker thread for the process, started
//! on the first `LeaseRunner::new`), on connections of the runner's renewal pool, which
//! that runtime drives: a body that blocks the caller's thread, even on a
//! current-thread runtime, cannot starve them.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{Held, LeaseOptions, Store};
use crate::common::millis;
use crate::error::Error;

/// The renewal runtime, started once; an error when its thread could not start.
pub(crate) fn runtime() -> Result<&'static Runtime, Error> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("pg_idempotency-renew")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    });
    runtime
        .as_ref()
        .map_err(|e| Error::Protocol(format!("the lease renewal thread did not start: {}", e)))
}

/// How often a lease is renewed: a third of it, at least every 50 ms.
pub(crate) fn period(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(50))
}

/// What the renewal task reports.
#[derive(Default)]
struct RenewState {
    lost: AtomicBool,
    renewals: AtomicU32,
}

/// The renewal task of one run. Dropping it (the run's future was dropped) aborts
/// the task: the lease is no longer renewed and runs out, nothing is released.
pub(crate) struct Renewer {
    state: Arc<RenewState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Renewer {
    /// Starts renewing `held` on the renewal runtime.
    pub(crate) fn start(store: &Store, held: &Held, options: &LeaseOptions) -> Renewer {
        let state = Arc::new(RenewState::default());
        let (stop, stopped) = oneshot::channel();
        let job = RenewJob {
            store: store.clone(),
            held: held.clone(),
            lease_ms: millis(Some(options.lease)).unwrap_or(0),
            period: period(options.lease),
            max_failures: options.max_renew_failures.max(1),
            state: state.clone(),
        };
        let task = runtime().expect("started by LeaseRunner::new").spawn(job.run(stopped));
        Renewer { state, stop: Some(stop), task: Some(task) }
    }

    /// Stops renewing and waits for the task: (lease lost, renewals).
    pub(crate) async fn stop(mut self) -> (bool, u32) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        (self.state.lost.load(Ordering::SeqCst), self.state.renewals.load(Ordering::SeqCst))
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

struct RenewJob {
    store: Store,
    held: Held,
    lease_ms: i64,
    period: Duration,
    max_failures: u32,
    state: Arc<RenewState>,
}

impl RenewJob {
    /// Renews every period until stopped. renew() returning false means the fence lost
    /// the key: renewing stops and the lease counts as lost. An error or a timeout (a
    /// renewal may take two periods: the lease is three) is retried at the next tick on
    /// another connection; after `max_failures` in a row renewing gives up and the lease
    /// counts as lost too, since it may have run out meanwhile.
    async fn run(self, mut stopped: oneshot::Receiver<()>) {
        let mut failures = 0;
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                _ = tokio::time::sleep(self.period) => {}
            }
            let renewed = self.store.renew(&self.held, self.lease_ms, self.period * 2).await;
            match renewed {
                Some(true) => {
                    failures = 0;
                    self.state.renewals.fetch_add(1, Ordering::SeqCst);
                }
                Some(false) => {
                    self.state.lost.store(true, Ordering::SeqCst);
                    return;
                }
                None => {
                    failures += 1;
                    if failures >= self.max_failures {
                        tracing::warn!(
                            key_sha256 = %self.held.digest,
                            fence = self.held.fence,
                            failures,
                            "pg_idempotency: lease renewal gave up; the run ends unfenced"
                        );
                        self.state.lost.store(true, Ordering::SeqCst);
                        return;
                    }
                }
            }
        }
    }
}
