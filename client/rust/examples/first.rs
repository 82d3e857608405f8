use std::time::Duration;

use pg_idempotency::{
    BoxError, LeaseOptions, LeaseOutcome, LeaseRunner, Policy, Request, Response,
};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // host=... port=... dbname=... user=... of a database with CREATE EXTENSION idempotency
    let config: tokio_postgres::Config = std::env::var("DSN")?.parse()?;
    let options = LeaseOptions {
        policy: Policy::Remember,       // or Policy::Once, Policy::CommitOnSuccess
        lease: Duration::from_secs(10), // renewed every 3.3 s while the body runs
        ..LeaseOptions::default()
    };
    let runner = LeaseRunner::new(config, options)?;

    let request = Request::new(
        "user-42",                  // the principal, from authentication
        Some("charge-7f3a".into()), // the Idempotency-Key header
        "POST",
        "/charges",
        Some(br#"{"amount": 1000, "currency": "eur"}"#.to_vec()),
    );
    for attempt in 1..=2 {
        let result = runner
            .run(&request, || async {
                // the effect outside the database: an upstream call, a payment
                Ok::<_, BoxError>(Response::new(201, vec![], r#"{"charge":"ch_1"}"#))
            })
            .await?;
        // attempt 1: Fresh (the body ran); attempt 2: Replayed (the stored response)
        println!("attempt {}: {:?} {}", attempt, result.outcome, result.response.status);
        assert!(result.outcome != LeaseOutcome::FreshUnfenced, "the lease was lost meanwhile");
    }
    Ok(())
}
