//! The renewal task of a lease: renews every third of the lease on a connection of
//! its own while the body runs.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_postgres::{Client as PgClient, Config};

use super::{connect, Held, LeaseOptions, RENEW_SQL, RUNNER_APPLICATION_NAME};
use crate::common::{millis, Error};

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
    pub(crate) fn start(config: &Config, held: &Held, options: &LeaseOptions) -> Renewer {
        let state = Arc::new(RenewState::default());
        let (stop, stopped) = oneshot::channel();
        let period = (options.lease / 3).max(Duration::from_millis(50));
        let mut config = config.clone();
        config.application_name(&format!("{}-renew", options.application_name));
        let job = RenewJob {
            config,
            principal: held.principal.clone(),
            key: held.key.clone(),
            fence: held.fence,
            lease_ms: millis(Some(options.lease)).unwrap_or(0),
            period,
            max_failures: options.max_renew_failures.max(1),
            state: state.clone(),
        };
        let task = tokio::spawn(job.run(stopped));
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
    config: Config,
    principal: String,
    key: String,
    fence: i64,
    lease_ms: i64,
    period: Duration,
    max_failures: u32,
    state: Arc<RenewState>,
}

impl RenewJob {
    /// Renews every period until stopped. renew() returning false means the fence lost
    /// the key: renewing stops and the lease counts as lost. An error (network,
    /// restart, a killed backend) is retried at the next tick on a fresh connection;
    /// after max_failures in a row renewing stops without declaring the lease lost.
    async fn run(self, mut stopped: oneshot::Receiver<()>) {
        // Connect at once, so the first renewal does not pay for the connection.
        let limit = self.period * 2;
        let connected = tokio::time::timeout(limit, connect(&self.config, self.name())).await;
        let mut client = connected.ok().and_then(Result::ok);
        let mut failures = 0;
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                _ = tokio::time::sleep(self.period) => {}
            }
            // A renewal (with a reconnect) may take up to two periods: the lease is three.
            let renewed = tokio::time::timeout(limit, self.renew_once(&mut client)).await;
            match renewed {
                Ok(Ok(true)) => {
                    failures = 0;
                    self.state.renewals.fetch_add(1, Ordering::SeqCst);
                }
                Ok(Ok(false)) => {
                    self.state.lost.store(true, Ordering::SeqCst);
                    return;
                }
                Ok(Err(_)) | Err(_) => {
                    client = None;
                    failures += 1;
                    if failures >= self.max_failures {
                        return;
                    }
                }
            }
        }
    }

    fn name(&self) -> &str {
        self.config.get_application_name().unwrap_or(RUNNER_APPLICATION_NAME)
    }

    async fn renew_once(&self, client: &mut Option<PgClient>) -> Result<bool, Error> {
        if client.as_ref().map_or(true, PgClient::is_closed) {
            *client = Some(connect(&self.config, self.name()).await?);
        }
        let client = client.as_ref().expect("connected above");
        let row = client
            .query_one(RENEW_SQL, &[&self.principal, &self.key, &self.fence, &self.lease_ms])
            .await?;
        Ok(row.get(0))
    }
}
