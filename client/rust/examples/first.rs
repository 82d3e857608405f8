use std::time::Duration;

use pg_idempotency::{BoxError, CallError, Done, Idempotency, Key, LeaseOptions, Remembered};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // host=... port=... dbname=... user=... of a database with CREATE EXTENSION idempotency
    let config: tokio_postgres::Config = std::env::var("DSN")?.parse()?;
    let options = LeaseOptions {
        lease: Duration::from_secs(10), // renewed every 3.3 s while a body runs
        pool_size: 8,                   // one bounded pool; the renewals share a small one
        ..Idempotency::default_options()  // keys hashed (SHA-256) before they reach the database
    };
    let idempotency = Idempotency::new(config, options)?;
    let day = Some(Duration::from_secs(86_400));

    // At most once: the second call does not run its body.
    let key = Key::new("user-42", "welcome-mail:alice@example.com");
    for attempt in 1..=2 {
        let sent = idempotency.once(&key, day, || async { Ok::<_, BoxError>("sent") }).await;
        match sent {
            Ok(Done::Fresh(what)) => println!("attempt {}: {}", attempt, what),
            Ok(Done::FreshUnfenced(what)) => println!("attempt {}: {}, unfenced", attempt, what),
            Ok(Done::Duplicate) => println!("attempt {}: done before", attempt),
            Err(CallError::Body { error, lease_lost }) => {
                println!("failed: {} {}", error, lease_lost)
            }
            Err(CallError::Db(error)) => return Err(error.into()),
        }
    }

    // Remembered: the second call gets the first call's value back.
    let key = Key::new("user-42", "charge-7f3a");
    for attempt in 1..=2 {
        let charge = idempotency
            .remember(&key, day, || async { Ok::<_, BoxError>(("ch_1".to_string(), 1000)) })
            .await
            .map_err(|e| e.to_string())?;
        match charge {
            Remembered::Fresh(c) | Remembered::Replayed(c) => println!("{}: {:?}", attempt, c),
            other => println!("attempt {}: {:?}", attempt, other),
        }
    }
    Ok(())
}
