//! The framework-shaped calls (`Idempotency`): typed results, the policy and the ttl
//! per call, hashed keys, release failures, lost leases on both paths, renewal that a
//! blocking body cannot starve, one bounded pool.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_idempotency::{key_digest, CallError, Done, Idempotency, Key, LeaseOptions, Remembered};
use serde::{Deserialize, Serialize};

fn calls(name: &str, lease_ms: u64) -> Idempotency {
    let options = LeaseOptions {
        lease: Duration::from_millis(lease_ms),
        application_name: name.to_string(),
        ..Idempotency::default_options()
    };
    Idempotency::new(common::config(), options).expect("calls")
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Charge {
    id: String,
    cents: i64,
}

#[tokio::test]
async fn once_runs_once_and_keeps_the_key_after_a_failure() {
    let calls = calls(&common::unique("once"), 5000);
    let principal = common::unique("once");
    let key = Key::new(&principal, "k");
    let first = calls.once(&key, None, || async { Ok::<_, String>(7) }).await.unwrap();
    assert_eq!(first, Done::Fresh(7));
    let again = calls.once(&key, None, || async { Ok::<_, String>(8) }).await.unwrap();
    assert_eq!(again, Done::Duplicate);
    let failing = Key::new(&principal, "failing");
    let failed = calls.once(&failing, None, || async { Err::<i32, _>("boom") }).await;
    assert!(matches!(failed, Err(CallError::Body { error: "boom", lease_lost: false })));
    let retry = calls.once(&failing, None, || async { Ok::<_, &str>(1) }).await.unwrap();
    assert_eq!(retry, Done::Duplicate, "once: a failure uses the key up");
}

#[tokio::test]
async fn commit_on_success_releases_after_a_failure_and_the_ttl_is_per_call() {
    let calls = calls(&common::unique("cos"), 300);
    let key = Key::new(common::unique("cos"), "k");
    let ttl = Some(Duration::from_millis(1200));
    let failed = calls.commit_on_success(&key, ttl, || async { Err::<i32, _>("no") }).await;
    assert!(matches!(failed, Err(CallError::Body { error: "no", .. })));
    let done = calls.commit_on_success(&key, ttl, || async { Ok::<_, &str>(2) }).await.unwrap();
    assert_eq!(done, Done::Fresh(2), "the failure released the key");
    let dup = calls.commit_on_success(&key, ttl, || async { Ok::<_, &str>(3) }).await.unwrap();
    assert_eq!(dup, Done::Duplicate);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = calls.commit_on_success(&key, ttl, || async { Ok::<_, &str>(4) }).await.unwrap();
    assert_eq!(later, Done::Fresh(4), "after this call's ttl");
}

#[tokio::test]
async fn remember_replays_a_typed_value_and_reports_in_progress() {
    let calls = Arc::new(calls(&common::unique("remember"), 5000));
    let key = Key::new(common::unique("remember"), "k");
    let charge = Charge { id: "ch_1".into(), cents: 1250 };
    let (started, go) = tokio::sync::oneshot::channel();
    let first = {
        let (calls, key, charge) = (calls.clone(), key.clone(), charge.clone());
        tokio::spawn(async move {
            calls
                .remember(&key, None, || async move {
                    let _ = started.send(());
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, String>(charge)
                })
                .await
        })
    };
    go.await.unwrap();
    let during = calls.remember(&key, None, || async { Ok::<Charge, String>(unreachable()) });
    assert_eq!(during.await.unwrap(), Remembered::InProgress);
    assert_eq!(first.await.unwrap().unwrap(), Remembered::Fresh(charge.clone()));
    let replay = calls.remember(&key, None, || async { Ok::<Charge, String>(unreachable()) });
    assert_eq!(replay.await.unwrap(), Remembered::Replayed(charge));
}

fn unreachable() -> Charge {
    panic!("the body must not run")
}

#[tokio::test]
async fn hashed_keys_take_any_material_and_never_store_it() {
    let calls = calls(&common::unique("hashed"), 5000);
    let admin = common::connect().await;
    let principal = common::unique("hashed");
    let materials = [
        "charge:alice@example.com:4111-1111-1111-1111".to_string(),
        "x".repeat(300),
        "Bestellung für Jürgen 注文 🧾".to_string(),
    ];
    for material in &materials {
        let key = Key::new(&principal, material.as_str());
        let done = calls.once(&key, None, || async { Ok::<_, String>(()) }).await.unwrap();
        assert_eq!(done, Done::Fresh(()), "{:?}", material);
        let again = calls.once(&key, None, || async { Ok::<_, String>(()) }).await.unwrap();
        assert_eq!(again, Done::Duplicate, "{:?}", material);
    }
    let rows = admin
        .query("SELECT key FROM idempotency.keys WHERE principal = $1 ORDER BY key", &[&principal])
        .await
        .unwrap();
    let stored: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let mut digests: Vec<String> = materials.iter().map(|m| key_digest(m)).collect();
    digests.sort();
    assert_eq!(stored, digests, "the SHA-256 of each key, the principal as given");
    for material in &materials {
        assert!(stored.iter().all(|s| !s.contains(material.as_str())));
    }
    let empty = Key::new(&principal, "");
    let empty = calls.once(&empty, None, || async { Ok::<_, String>(()) });
    assert!(matches!(empty.await, Err(CallError::Db(_))), "an empty key is refused");
}

#[tokio::test]
async fn a_release_that_fails_is_logged_and_the_body_error_returned() {
    // A database of its own: the test takes idempotency.release away while a body runs.
    let admin = common::connect().await;
    let (db, config) = common::own_database(&admin, "release-fails").await;
    let owner = common::connect_to(&config).await;
    let options =
        LeaseOptions { lease: Duration::from_millis(1500), ..Idempotency::default_options() };
    let calls = Idempotency::new(config, options).unwrap();
    let key = Key::new("p", "k");
    let failed = calls
        .commit_on_success(&key, None, || async {
            owner
                .batch_execute(
                    "ALTER FUNCTION idempotency.release(text, text, bigint) RENAME TO gone",
                )
                .await
                .unwrap();
            Err::<(), _>("the body's own error")
        })
        .await;
    owner
        .batch_execute("ALTER FUNCTION idempotency.gone(text, text, bigint) RENAME TO release")
        .await
        .unwrap();
    match failed {
        Err(CallError::Body { error, lease_lost }) => {
            assert_eq!(error, "the body's own error");
            assert!(!lease_lost, "the lease held; only its release failed");
        }
        other => panic!("the body's error, not the release's: {:?}", other),
    }
    let held = calls.commit_on_success(&key, None, || async { Ok::<_, &str>(()) }).await;
    assert_eq!(held.unwrap(), Done::Duplicate, "fail closed: held until the lease runs out");
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let later = calls.commit_on_success(&key, None, || async { Ok::<_, &str>(()) }).await;
    assert_eq!(later.unwrap(), Done::Fresh(()), "after the lease");
    drop(calls);
    common::drop_database(&admin, &db).await;
}

#[tokio::test]
async fn a_lost_lease_is_reported_on_both_paths() {
    let calls = calls(&common::unique("lost"), 300);
    let admin = common::connect().await;
    let principal = common::unique("lost");
    let digest = key_digest("k");
    let forget = || async {
        admin.execute("SELECT idempotency.forget($1, $2)", &[&principal, &digest]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
    };
    let key = Key::new(&principal, "k");
    let ok = calls.remember(&key, None, || async {
        forget().await;
        Ok::<_, String>(5)
    });
    assert_eq!(ok.await.unwrap(), Remembered::FreshUnfenced(5));
    let err = calls.commit_on_success(&key, None, || async {
        forget().await;
        Err::<(), _>("failed")
    });
    assert!(matches!(err.await, Err(CallError::Body { lease_lost: true, .. })));
}

#[test]
fn a_blocking_body_on_a_current_thread_runtime_cannot_starve_the_renewal() {
    let name = common::unique("blocking");
    let principal = common::unique("blocking");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mine = runtime.block_on(async { calls(&name, 300) });
    let runs = Arc::new(AtomicU32::new(0));
    let key = Key::new(&principal, "k");
    let result = runtime.block_on(mine.once(&key, None, || async {
        runs.fetch_add(1, Ordering::SeqCst);
        // Blocks this runtime's only thread for four leases; meanwhile another process
        // (a thread with a runtime of its own) tries the same key twice.
        let other = {
            let (key, runs, name) = (key.clone(), runs.clone(), name.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Runtime::new().unwrap();
                runtime.block_on(async {
                    let others = calls(&format!("{}-other", name), 300);
                    let mut answers = Vec::new();
                    for _ in 0..2 {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        let done = others
                            .once(&key, None, || async {
                                runs.fetch_add(1, Ordering::SeqCst);
                                Ok::<_, String>(())
                            })
                            .await
                            .unwrap();
                        answers.push(done);
                    }
                    answers
                })
            })
        };
        std::thread::sleep(Duration::from_millis(1200));
        Ok::<_, String>(other)
    }));
    let other = match result.unwrap() {
        Done::Fresh(other) => other.join().unwrap(),
        Done::FreshUnfenced(_) => panic!("the lease was lost while the body blocked"),
        Done::Duplicate => panic!("the first call is not a duplicate"),
    };
    assert_eq!(other, [Done::Duplicate, Done::Duplicate]);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

#[tokio::test]
async fn the_calls_share_one_bounded_pool() {
    let name = common::unique("bounded");
    let options = LeaseOptions {
        lease: Duration::from_millis(300),
        application_name: name.clone(),
        pool_size: 2,
        renew_pool_size: 1,
        ..Idempotency::default_options()
    };
    let calls = Arc::new(Idempotency::new(common::config(), options).unwrap());
    let admin = common::connect().await;
    let principal = common::unique("bounded");
    let mut tasks = Vec::new();
    for i in 0..12 {
        let (calls, key) = (calls.clone(), Key::new(&principal, format!("k{}", i)));
        tasks.push(tokio::spawn(async move {
            calls
                .once(&key, None, || async {
                    tokio::time::sleep(Duration::from_millis(500)).await; // renewed once at least
                    Ok::<_, String>(())
                })
                .await
                .unwrap()
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pattern = format!("{}%", name);
    let row = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1",
            &[&pattern],
        )
        .await
        .unwrap();
    let connections: i64 = row.get(0);
    assert!(connections <= 3, "2 + 1 connections at most, not one per run: {}", connections);
    for task in tasks {
        assert_eq!(task.await.unwrap(), Done::Fresh(()));
    }
}

#[tokio::test]
async fn renewing_gives_up_after_max_renew_failures_and_the_run_is_unfenced() {
    // A database of its own: the test locks the key table for longer than the lease.
    let admin = common::connect().await;
    let (db, config) = common::own_database(&admin, "give-up").await;
    let mut locker = common::connect_to(&config).await;
    let options = LeaseOptions {
        lease: Duration::from_millis(300),
        max_renew_failures: 2,
        ..Idempotency::default_options()
    };
    let calls = Idempotency::new(config, options).unwrap();
    let key = Key::new("p", "k");
    let done = calls
        .once(&key, None, || async {
            // Every renewal blocks on the table and times out (two periods, 200 ms):
            // two failures in a row, then renewing gives up.
            let tx = locker.transaction().await.unwrap();
            tx.batch_execute("LOCK TABLE idempotency.keys IN ACCESS EXCLUSIVE MODE").await.unwrap();
            tokio::time::sleep(Duration::from_millis(900)).await;
            tx.rollback().await.unwrap();
            Ok::<_, String>(1)
        })
        .await
        .unwrap();
    assert_eq!(done, Done::FreshUnfenced(1), "the lease may have run out: not fenced");
    drop(calls);
    common::drop_database(&admin, &db).await;
}
