//! The outcome `expired` (a retry of a key that expired under its action's on_expiry
//! 'refuse' policy: 410 with the past Idempotency-Expires) through `Client::handle` and
//! `LeaseRunner::run`, and the lease runner's expiry and wait/reject mode, against a
//! real cluster. The expired test needs an extension with idempotency.set_expiry_policy
//! (0.8.0) and says it skipped on an older one.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pg_idempotency::http::{http_date, EXPIRES_HEADER};
use pg_idempotency::{
    Begun, BoxError, Client, Connection, DuplicateMode, LeaseOptions, LeaseOutcome, LeaseRunner,
    Options, Policy, Request, Response,
};
use tokio_postgres::Transaction;

const ORDER: &str = "{\"item\":\"book\"}";

fn request(principal: &str, key: &str, body: &str, action: &str) -> Request {
    let body = Some(body.as_bytes().to_vec());
    Request {
        action: action.into(),
        ..Request::new(principal, Some(key.into()), "POST", "/o", body)
    }
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

async fn stored_epoch(pg: &tokio_postgres::Client, who: &str, key: &str) -> i64 {
    let sql =
        "SELECT floor(extract(epoch FROM expires_at))::bigint FROM idempotency.lookup($1, $2)";
    pg.query_one(sql, &[&who, &key]).await.unwrap().get(0)
}

async fn lease_run(
    runner: &LeaseRunner,
    req: &Request,
    runs: &AtomicU32,
    status: u16,
) -> pg_idempotency::LeaseResult {
    runner
        .run(req, || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(Response::new(status, vec![], "{}"))
        })
        .await
        .expect("run")
}

#[tokio::test]
async fn a_lease_result_carries_the_rows_expiry() {
    let pg = common::connect().await;
    let runner = LeaseRunner::new(common::config(), LeaseOptions::default()).unwrap();
    let (who, runs) = (common::unique("lease-expiry"), AtomicU32::new(0));
    let req = request(&who, "k", ORDER, "");
    let first = lease_run(&runner, &req, &runs, 201).await;
    let want = stored_epoch(&pg, &who, "k").await;
    assert_eq!(first.outcome, LeaseOutcome::Fresh);
    assert!(want > now());
    assert_eq!(first.expires_epoch, Some(want));
    assert_eq!(first.response.header(EXPIRES_HEADER), Some(http_date(want).as_str()));
    let again = lease_run(&runner, &req, &runs, 201).await;
    assert_eq!(again.outcome, LeaseOutcome::Replayed);
    assert_eq!(again.expires_epoch, Some(want));
    assert_eq!(again.response.header(EXPIRES_HEADER), Some(http_date(want).as_str()));
    let released = lease_run(&runner, &request(&who, "k2", ORDER, ""), &runs, 503).await;
    assert_eq!(released.expires_epoch, None);
    assert_eq!(released.response.header(EXPIRES_HEADER), None);
}

#[tokio::test]
async fn the_lease_runner_rejects_a_duplicate_at_once() {
    let mut pg = common::connect().await;
    for per_request in [false, true] {
        let who = common::unique("lease-reject");
        let mut req = request(&who, "k", ORDER, "");
        let holder: Transaction<'_> = pg.transaction().await.unwrap();
        assert!(matches!(Client::default().begin(&holder, &req).await.unwrap(), Begun::Started));
        let mut options =
            LeaseOptions { wait: Some(Duration::from_secs(3)), ..LeaseOptions::default() };
        if per_request {
            req.duplicates = Some(DuplicateMode::Reject);
        } else {
            options.duplicates = DuplicateMode::Reject;
        }
        let runner = LeaseRunner::new(common::config(), options).unwrap();
        let runs = AtomicU32::new(0);
        let started = Instant::now();
        let busy = lease_run(&runner, &req, &runs, 201).await;
        let took = started.elapsed();
        holder.rollback().await.unwrap();
        assert_eq!(busy.outcome, LeaseOutcome::InProgress, "per request: {}", per_request);
        assert!(took < Duration::from_secs(1), "did not wait: {:?}", took);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}

/// handle() with a handler that counts its runs and answers 201.
async fn handled(
    client: &Client,
    conn: &mut Connection,
    req: &Request,
    runs: &AtomicU32,
) -> Response {
    client
        .handle(conn, req, |_tx: &Transaction<'_>| {
            runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Ok(Response::new(201, vec![], "{}")) })
        })
        .await
        .unwrap()
}

fn check_gone(what: &str, response: &Response) {
    let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(response.status, 410, "{}", what);
    assert_eq!(body["type"], "/problems/idempotency-key-expired", "{}", what);
    assert_eq!(body["title"], "Idempotency-Key has expired", "{}", what);
    assert!(!response.replayed && response.header("Idempotent-Replay").is_none(), "{}", what);
}

#[tokio::test]
async fn an_expired_key_is_410_without_running() {
    let pg = common::connect().await;
    let has: bool = pg
        .query_one("SELECT to_regproc('idempotency.set_expiry_policy') IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
    if !has {
        eprintln!("SKIPPED: the extension has no idempotency.set_expiry_policy (0.8.0 tombstones)");
        return;
    }
    let action = common::unique("gone-action");
    pg.execute("SELECT idempotency.set_expiry_policy($1, 'refuse')", &[&action]).await.unwrap();
    let who = common::unique("gone");
    let req = request(&who, "k", ORDER, &action);
    let mut conn = Connection::new(common::connect().await);
    let client = Client::new(Options::default());
    let runs = AtomicU32::new(0);
    assert_eq!(handled(&client, &mut conn, &req, &runs).await.status, 201);
    // The contract's test sequence: the key expires now and cleanup leaves a tombstone.
    let expire = "UPDATE idempotency.keys SET created_at = now() - interval '1 hour', \
                  expires_at = now() - interval '1 second' \
                  WHERE principal = $1 AND key = 'k'";
    pg.execute(expire, &[&who]).await.unwrap();
    let expired = now() - 1;
    pg.execute("SELECT idempotency.cleanup_batch(1000)", &[]).await.unwrap();
    let gone = handled(&client, &mut conn, &req, &runs).await;
    check_gone("client", &gone);
    let told = httpdate_epoch(gone.header(EXPIRES_HEADER).expect("the expiry header"));
    assert!((told - expired).abs() <= 1 && told < now(), "told {} expired {}", told, expired);
    let other = handled(&client, &mut conn, &request(&who, "k", "{}", &action), &runs).await;
    assert_eq!(other.status, 422);
    let runner = LeaseRunner::new(
        common::config(),
        LeaseOptions { policy: Policy::Remember, ..LeaseOptions::default() },
    )
    .unwrap();
    let leased = lease_run(&runner, &req, &runs, 201).await;
    assert_eq!(leased.outcome, LeaseOutcome::Expired);
    check_gone("lease", &leased.response);
    assert!((leased.expires_epoch.unwrap() - expired).abs() <= 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    pg.execute("SELECT idempotency.set_expiry_policy($1, 'run')", &[&action]).await.unwrap();
}

/// The epoch seconds of an IMF-fixdate, by formatting candidates around now.
fn httpdate_epoch(value: &str) -> i64 {
    let t = now();
    (t - 3600..t + 3600).find(|&e| http_date(e) == value).expect("an IMF-fixdate within the hour")
}
