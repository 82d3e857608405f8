//! A few tokio-postgres connections shared by the server's tasks (one request at a
//! time each), with the service's statements prepared once per connection.

use std::str::FromStr;
use std::sync::Mutex;

use pg_idempotency::Connection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::{Config, NoTls, Statement};

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, \
     principal text NOT NULL, item text NOT NULL, quantity int NOT NULL, \
     created_at timestamptz NOT NULL DEFAULT now());
     CREATE TABLE IF NOT EXISTS api_keys (id bigserial PRIMARY KEY, principal text NOT NULL, \
     name text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())";

/// The service's own statements, prepared on each connection.
#[derive(Clone)]
pub struct Statements {
    pub insert_order: Statement,
    pub insert_api_key: Statement,
    pub sleep: Statement,
}

/// One pooled connection and its statements.
pub struct Slot {
    pub conn: Connection,
    pub statements: Statements,
    _permit: OwnedSemaphorePermit,
}

pub struct Pool {
    config: Config,
    idle: Mutex<Vec<(Connection, Statements)>>,
    slots: std::sync::Arc<Semaphore>,
}

impl Pool {
    /// A pool for the DSN; connections are made when they are needed.
    pub fn open(dsn: &str, size: usize) -> Result<Pool, tokio_postgres::Error> {
        let config = Config::from_str(dsn)?;
        let slots = std::sync::Arc::new(Semaphore::new(size.max(1)));
        Ok(Pool { config, idle: Mutex::new(Vec::new()), slots })
    }

    /// The connection settings.
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// Closes every idle connection: after a database fault (a restart ended them all),
    /// the next requests connect afresh instead of failing once per stale connection.
    pub fn discard_idle(&self) {
        self.idle.lock().expect("pool lock").clear();
    }

    /// An idle connection that is still open, or a new one.
    pub async fn get(&self) -> Result<Slot, tokio_postgres::Error> {
        let permit =
            self.slots.clone().acquire_owned().await.expect("the semaphore is never closed");
        loop {
            let idle = self.idle.lock().expect("pool lock").pop();
            let (conn, statements) = match idle {
                Some(pair) if pair.0.is_closed() => continue, // lost while idle: dropped
                Some(pair) => pair,
                None => self.connect().await?,
            };
            return Ok(Slot { conn, statements, _permit: permit });
        }
    }

    /// Back to the pool, unless the connection is gone.
    pub fn put(&self, slot: Slot) {
        if !slot.conn.is_closed() {
            self.idle.lock().expect("pool lock").push((slot.conn, slot.statements));
        }
    }

    async fn connect(&self) -> Result<(Connection, Statements), tokio_postgres::Error> {
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(connection);
        let statements = Statements {
            insert_order: client
                .prepare(
                    "INSERT INTO orders (principal, item, quantity) VALUES ($1, $2, $3) \
                     RETURNING id, created_at::text",
                )
                .await?,
            insert_api_key: client
                .prepare("INSERT INTO api_keys (principal, name) VALUES ($1, $2) RETURNING id")
                .await?,
            sleep: client.prepare("SELECT pg_sleep($1::int8 / 1000.0)").await?,
        };
        Ok((Connection::new(client), statements))
    }

    /// The number of orders; the connection is not put back after an error.
    pub async fn count_orders(&self) -> Result<i64, tokio_postgres::Error> {
        let mut slot = self.get().await?;
        let count = slot.conn.client().query_one("SELECT count(*) FROM orders", &[]).await?;
        self.put(slot);
        Ok(count.get(0))
    }
}

/// Makes the tables once the database answers, retrying every second.
pub async fn prepare(config: Config) {
    loop {
        match config.connect(NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                match client.batch_execute(SCHEMA).await {
                    Ok(()) => return,
                    Err(e) => eprintln!("rust-orders: cannot prepare the database yet ({})", e),
                }
            }
            Err(e) => eprintln!("rust-orders: cannot prepare the database yet ({})", e),
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
