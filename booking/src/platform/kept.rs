//! A Postgres pool for one-statement hot paths (seat and GA holds, releases) whose connections
//! go back to a stack of its own between statements, ready for the next one.
//!
//! Why: sqlx's pool pings a connection when it is handed out (`test_before_acquire`) and again
//! when it comes back (unconditionally, sqlx 0.9 `Floating::return_to_pool`): a seat hold was
//! three round trips to Postgres (ping, statement, ping) on a box where every round trip
//! wakes a backend on one of two shared cores. Measured with `deploy/bench/holds.sh`'s A/B mode
//! (the two builds alternating on the same events; docs/benchmarks.md, "Issue 16: one round
//! trip per hold"): seat holds +4 to +20 % in three rounds, booking's and loadgen's CPU per
//! hold a third lower.
//!
//! What keeps it safe:
//! - A connection goes back to the stack only after its statement ended with an answer from
//!   Postgres (rows, or a database error such as a unique violation). Any other end (an I/O
//!   or protocol error, a future dropped mid-statement when the client went away) hands it back
//!   to sqlx's pool instead, which drains or discards it as before.
//! - A statement cut off after its answer was read leaves at most the trailing
//!   `ReadyForQuery` unread: sqlx reads it before the next statement on that connection
//!   (`wait_until_ready`), so nothing of one request reaches the next.
//! - A connection idle on the stack longer than [`IDLE_CHECK`] is pinged before use (Postgres
//!   restarted, an idle backend terminated).
//! - A statement that failed without Postgres' answer (an I/O error: the network or Postgres
//!   went away) makes every connection on the stack suspect: they all go back to sqlx's pool,
//!   which pings each before handing it out again. So after an outage one request fails per
//!   broken connection in use, not one per connection the stack kept. (sqlx's pool itself
//!   keeps its ping on hand-out for every other pool of the process: the checkout's
//!   transactions, the webhooks.)
//! - Waiting is done on this pool's own semaphore (FIFO, one permit per connection sqlx
//!   may open), so no request waits in sqlx's queue while a connection sits on the stack.
//! - Transactions ([`KeptPool::begin`]) run on a second, small pool with the same settings:
//!   the stack may hold every statement connection idle, and a transaction must not wait for
//!   one that nobody will hand back to sqlx. They are the rare path here (a hold that
//!   reclaims expired seats, an account's own expired holds), so that pool stays small and
//!   opens its connections only when one runs.

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgDatabaseError, PgQueryResult, PgRow, PgSeverity, PgStatement, PgTypeInfo};
use sqlx::{Connection, Either, Execute, Executor, PgConnection, PgPool, Postgres, SqlStr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A connection idle on the stack this long is pinged before it serves a statement.
pub const IDLE_CHECK: Duration = Duration::from_secs(1);

/// See the module docs. Cheap to clone.
#[derive(Clone)]
pub struct KeptPool {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    tx_pool: PgPool,
    idle: Mutex<Vec<Idle>>,
    permits: Arc<Semaphore>,
    acquire_timeout: Duration,
}

struct Idle {
    conn: PoolConnection<Postgres>,
    since: Instant,
}

impl Inner {
    /// The stack (a poisoned lock still holds whole connections: a panic cannot tear a push).
    fn idle(&self) -> MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for KeptPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptPool")
            .field("kept", &self.kept())
            .field("pool", &self.inner.pool)
            .finish()
    }
}

impl KeptPool {
    /// Keeps the connections of `pool` (which nothing else should use: its size is this
    /// pool's size); transactions run on `tx_pool`.
    pub fn new(pool: PgPool, tx_pool: PgPool) -> KeptPool {
        let options = pool.options();
        let size = options.get_max_connections() as usize;
        let acquire_timeout = options.get_acquire_timeout();
        KeptPool {
            inner: Arc::new(Inner {
                pool,
                tx_pool,
                idle: Mutex::new(Vec::with_capacity(size)),
                permits: Arc::new(Semaphore::new(size)),
                acquire_timeout,
            }),
        }
    }

    /// Connections waiting on the stack.
    pub fn kept(&self) -> usize {
        self.inner.idle().len()
    }

    /// Closes the pool: no new leases, the kept connections go back to sqlx's pool, which
    /// closes them all (waiting for those still in use, as `PgPool::close` does).
    pub async fn close(&self) {
        self.inner.permits.close();
        let kept = std::mem::take(&mut *self.inner.idle());
        drop(kept);
        self.inner.pool.close().await;
        self.inner.tx_pool.close().await;
    }

    /// A transaction, on the transactions' pool (see the module docs).
    pub async fn begin(&self) -> Result<sqlx::Transaction<'static, Postgres>, sqlx::Error> {
        self.inner.tx_pool.begin().await
    }

    /// A connection for one statement: the most recently used one from the stack, else one
    /// from sqlx's pool. Waits up to the pool's acquire timeout.
    pub async fn acquire(&self) -> Result<Lease, sqlx::Error> {
        let permit = tokio::time::timeout(
            self.inner.acquire_timeout,
            self.inner.permits.clone().acquire_owned(),
        )
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)?
        .map_err(|_| sqlx::Error::PoolClosed)?;
        let conn = loop {
            let top = self.inner.idle().pop();
            let Some(Idle { mut conn, since }) = top else {
                break self.inner.pool.acquire().await?;
            };
            // A dead one is dropped to sqlx, which closes it; try the next one.
            if since.elapsed() <= IDLE_CHECK || conn.ping().await.is_ok() {
                break conn;
            }
        };
        Ok(Lease {
            conn: Some(conn),
            end: End::Open,
            pool: self.inner.clone(),
            _permit: permit,
        })
    }
}

/// One connection of a [`KeptPool`], for one statement. Dropped after [`Lease::ended`] it goes
/// back on the stack; dropped otherwise, back to sqlx's pool.
pub struct Lease {
    conn: Option<PoolConnection<Postgres>>,
    end: End,
    pool: Arc<Inner>,
    // Released after `drop` has put the connection back (fields drop after the body).
    _permit: OwnedSemaphorePermit,
}

/// How the statement on a [`Lease`] ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    /// Not recorded: cut off midway (the request's future was dropped). Back to sqlx.
    Open,
    /// Postgres answered: back on the stack.
    Answered,
    /// Ended without Postgres' answer: back to sqlx, and every kept connection with it.
    Failed,
}

impl Lease {
    /// Records how the statement on this connection ended: with an answer from Postgres (the
    /// connection is in a known state) or not.
    pub fn ended<T>(&mut self, result: &Result<T, sqlx::Error>) {
        self.ended_if(result.as_ref().map_or_else(answered, |_| true));
    }

    /// [`Lease::ended`] for callers whose error wraps sqlx's: `answered` is false when the
    /// statement ended without Postgres' answer ([`answered`] of the sqlx error).
    pub fn ended_if(&mut self, answered: bool) {
        self.end = if answered { End::Answered } else { End::Failed };
    }
}

/// True when Postgres answered although the statement failed and the connection is still
/// good: an error it reported (not a `FATAL` one, which ends the session: a terminated
/// backend says so on its way out), no row, or an error decoding what it sent.
pub fn answered(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d
            .try_downcast_ref::<PgDatabaseError>()
            .is_none_or(|pg| !matches!(pg.severity(), PgSeverity::Fatal | PgSeverity::Panic)),
        sqlx::Error::RowNotFound
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::Decode(_) => true,
        _ => false,
    }
}

impl std::ops::Deref for Lease {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        // Present until drop.
        self.conn
            .as_deref()
            .expect("a lease holds its connection until dropped")
    }
}

impl std::ops::DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_deref_mut()
            .expect("a lease holds its connection until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        // Not kept: a connection goes back through sqlx's own release (ping, or close when
        // broken), and after a failure without an answer so does every kept one (see the
        // module docs); dropped once the stack's lock is let go.
        match self.end {
            End::Answered => self.pool.idle().push(Idle {
                conn,
                since: Instant::now(),
            }),
            End::Open => drop(conn),
            End::Failed => {
                let suspect = std::mem::take(&mut *self.pool.idle());
                drop((suspect, conn));
            }
        }
    }
}

/// `fetch_one(&kept)`, `fetch_all(&kept)`, … as with `&PgPool`: one lease per statement.
impl<'p> Executor<'p> for &'_ KeptPool {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        E: 'q + Execute<'q, Postgres>,
    {
        let pool = self.clone();
        // The whole answer is read before it is handed out, so the lease ends with the
        // statement (these are short answers: a hold's seats, one row).
        futures::stream::once(async move {
            let mut lease = pool.acquire().await?;
            let r: Result<Vec<_>, sqlx::Error> =
                (&mut *lease).fetch_many(query).try_collect().await;
            lease.ended(&r);
            r
        })
        .map_ok(|all| futures::stream::iter(all.into_iter().map(Ok)))
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        E: 'q + Execute<'q, Postgres>,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut lease = pool.acquire().await?;
            let r = (&mut *lease).fetch_optional(query).await;
            lease.ended(&r);
            r
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'p: 'e,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut lease = pool.acquire().await?;
            let r = (&mut *lease).prepare_with(sql, parameters).await;
            lease.ended(&r);
            r
        })
    }

    fn describe<'e>(
        self,
        sql: SqlStr,
    ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut lease = pool.acquire().await?;
            let r = (&mut *lease).describe(sql).await;
            lease.ended(&r);
            r
        })
    }
}
