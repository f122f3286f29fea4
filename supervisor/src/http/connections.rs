//! The accept loop's table of open client connections: which are waiting for a request head (a slow
//! or idle client) and which carry a request, and how many each peer holds.
//!
//! At `server.max_connections` a new client is still accepted when some connection is only waiting:
//! the oldest waiting one is closed to make room, so a request that arrives whole is never starved
//! by clients that trickle their headers (slowloris). A connection counts as waiting only once a
//! read has found no whole head in it: a new connection whose head is already there is read before
//! it can be chosen, however fast slow clients reconnect. One peer holds at most
//! `server.max_connections_per_client` that wait; past that its own oldest waiting connection makes
//! room, and when all of that peer's connections carry requests it may take a free place (a busy
//! client or a proxy is not a slow one), never another's: a new one is refused only at the cap.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::http::protocol::Refusal;

/// How often the summary of closed and refused connections may be logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The open connections and their limits.
#[derive(Debug)]
pub struct Connections {
    table: Mutex<Table>,
    /// Woken when a connection closes or stops carrying requests: the accept loop may have room.
    changed: Arc<Notify>,
    max: usize,
    per_client: usize,
}

#[derive(Debug, Default)]
struct Table {
    /// By id, which is the order of acceptance: the first waiting one is the oldest.
    open: BTreeMap<u64, Arc<Connection>>,
    per_peer: HashMap<IpAddr, usize>,
    next_id: u64,
    closed_waiting: u64,
    refused: u64,
    warned: Option<Instant>,
}

/// One open connection, shared by its task, its IO and its service.
#[derive(Debug)]
pub struct Connection {
    id: u64,
    peer: IpAddr,
    /// Requests whose head has arrived and whose response is not yet written.
    requests: AtomicUsize,
    /// A read found no whole request head (the client is slow, or idles between requests).
    stalled: AtomicBool,
    /// The response to the request in progress must close the connection (its body was chunked, so
    /// the next head's start is not known to the head check).
    close_after: AtomicBool,
    /// A refused head, answered by the service in place of a request.
    refusal: Mutex<Option<Refusal>>,
    /// Cancelled when the table closes this connection to make room.
    evict: CancellationToken,
    changed: Arc<Notify>,
}

/// A connection's place in the table; dropping it frees the place.
#[derive(Debug)]
pub struct Registered {
    connection: Arc<Connection>,
    connections: Arc<Connections>,
}

impl Connections {
    /// A table for at most `max` connections, `per_client` of them from one peer address.
    pub fn new(max: usize, per_client: usize) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(Table::default()),
            changed: Arc::new(Notify::new()),
            max: max.max(1),
            per_client: per_client.clamp(1, max.max(1)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open connections.
    pub fn len(&self) -> usize {
        self.lock().open.len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until a new connection can be taken: below the cap, or a waiting one can be closed.
    /// While every connection carries a request, new clients wait in the kernel's accept queue.
    pub async fn room(&self) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let table = self.lock();
                if table.open.len() < self.max || table.open.values().any(|c| c.waiting()) {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Takes a new connection from `peer`, closing the oldest waiting connection (the peer's own
    /// when the peer is at its limit) if there is no room; `None` (close the new one) when nothing
    /// can make room.
    ///
    /// A peer at its limit whose connections all carry requests is a busy client (or a proxy in
    /// front of many), not a slow one: it may take a free place, never another peer's.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Registered> {
        let mut table = self.lock();
        let peer_full = table.per_peer.get(&peer).copied().unwrap_or(0) >= self.per_client;
        let mut closed = peer_full && table.close_oldest_waiting(Some(peer));
        if !closed && table.open.len() >= self.max {
            if !table.close_oldest_waiting(None) {
                table.refused += 1;
                table.warn_at_most_every(WARN_EVERY, self.max, self.per_client);
                return None;
            }
            closed = true;
        }
        if closed {
            table.warn_at_most_every(WARN_EVERY, self.max, self.per_client);
        }
        let id = table.next_id;
        table.next_id += 1;
        let connection = Arc::new(Connection {
            id,
            peer,
            requests: AtomicUsize::new(0),
            stalled: AtomicBool::new(false),
            close_after: AtomicBool::new(false),
            refusal: Mutex::new(None),
            evict: CancellationToken::new(),
            changed: Arc::clone(&self.changed),
        });
        table.open.insert(id, Arc::clone(&connection));
        *table.per_peer.entry(peer).or_insert(0) += 1;
        Some(Registered {
            connection,
            connections: Arc::clone(self),
        })
    }

    fn release(&self, connection: &Connection) {
        self.lock().remove(connection.id, connection.peer);
        self.changed.notify_waiters();
    }
}

impl Table {
    fn remove(&mut self, id: u64, peer: IpAddr) -> bool {
        if self.open.remove(&id).is_none() {
            return false;
        }
        if let Some(count) = self.per_peer.get_mut(&peer) {
            *count -= 1;
            if *count == 0 {
                self.per_peer.remove(&peer);
            }
        }
        true
    }

    /// Closes the oldest connection (of `peer`, when given) that carries no request.
    fn close_oldest_waiting(&mut self, peer: Option<IpAddr>) -> bool {
        let victim = self
            .open
            .values()
            .find(|c| c.waiting() && peer.is_none_or(|p| c.peer == p))
            .map(Arc::clone);
        let Some(victim) = victim else { return false };
        self.remove(victim.id, victim.peer);
        victim.evict.cancel();
        self.closed_waiting += 1;
        true
    }

    fn warn_at_most_every(&mut self, every: Duration, max: usize, per_client: usize) {
        if self.warned.is_some_and(|at| at.elapsed() < every) {
            return;
        }
        self.warned = Some(Instant::now());
        tracing::warn!(
            open = self.open.len(),
            closed_waiting = self.closed_waiting,
            refused = self.refused,
            max_connections = max,
            max_connections_per_client = per_client,
            "connection limit reached: closing connections that have not sent a request head to make room, \
             refusing new ones when every connection carries a request"
        );
    }
}

impl Connection {
    /// Whether it carries no request and a read found no whole head in it (it waits for a head, or
    /// idles between requests): only such a connection is closed to make room.
    pub fn waiting(&self) -> bool {
        self.requests.load(Ordering::Acquire) == 0 && self.stalled.load(Ordering::Acquire)
    }

    /// A read found no whole request head: the connection may now be closed to make room.
    pub fn stalled(&self) {
        if !self.stalled.swap(true, Ordering::AcqRel) {
            self.changed.notify_waiters();
        }
    }

    /// A request head has arrived whole.
    pub fn begin_request(&self) {
        self.requests.fetch_add(1, Ordering::AcqRel);
    }

    /// A request's response has been written (or abandoned).
    pub fn end_request(&self) {
        if self.requests.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.changed.notify_waiters();
        }
    }

    /// The response in progress must close the connection.
    pub fn close_after_response(&self) {
        self.close_after.store(true, Ordering::Release);
    }

    /// Whether responses must close the connection.
    pub fn closes_after_response(&self) -> bool {
        self.close_after.load(Ordering::Acquire)
    }

    /// Records a refused head, for the service to answer.
    pub fn refuse(&self, refusal: Refusal) {
        *self.refusal.lock().unwrap_or_else(|p| p.into_inner()) = Some(refusal);
    }

    /// The refused head to answer, if the request in progress stands for one.
    pub fn take_refusal(&self) -> Option<Refusal> {
        self.refusal.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Completes when the table closes this connection to make room.
    pub async fn evicted(&self) {
        self.evict.cancelled().await;
    }
}

impl Registered {
    /// The connection.
    pub fn connection(&self) -> &Arc<Connection> {
        &self.connection
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.connections.release(&self.connection);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 3));

    #[test]
    fn at_the_cap_the_oldest_waiting_connection_makes_room() {
        let table = Connections::new(3, 3);
        let first = table.admit(A).expect("1");
        let second = table.admit(A).expect("2");
        let third = table.admit(B).expect("3");
        for c in [&first, &second, &third] {
            c.connection().stalled();
        }
        first.connection().begin_request();
        // The oldest that only waits is the second.
        let fourth = table.admit(B).expect("room made");
        fourth.connection().stalled();
        assert!(second.connection().evict.is_cancelled());
        assert!(!first.connection().evict.is_cancelled() && !third.connection().evict.is_cancelled());
        assert_eq!(table.len(), 3);
        // All busy: the next one is refused.
        third.connection().begin_request();
        fourth.connection().begin_request();
        assert!(table.admit(B).is_none());
        fourth.connection().end_request();
        let _fifth = table
            .admit(B)
            .expect("a finished request makes its connection closable");
        assert!(fourth.connection().evict.is_cancelled());
        drop(second);
        assert_eq!(table.len(), 3, "dropping an evicted connection frees nothing twice");
    }

    #[test]
    fn one_peer_cannot_take_every_place_with_waiting_connections() {
        let table = Connections::new(4, 2);
        let a1 = table.admit(A).expect("a1");
        let a2 = table.admit(A).expect("a2");
        a1.connection().stalled();
        a2.connection().stalled();
        let a3 = table.admit(A).expect("A's own oldest waiting connection makes room");
        assert!(a1.connection().evict.is_cancelled());
        assert!(!a2.connection().evict.is_cancelled());
        assert_eq!(table.len(), 2, "A still holds two places");
        a3.connection().stalled();
        let b = table.admit(B).expect("another peer still gets in");
        b.connection().stalled();
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn a_busy_peer_past_its_limit_takes_only_free_places() {
        let table = Connections::new(4, 2);
        let a1 = table.admit(A).expect("a1");
        let a2 = table.admit(A).expect("a2");
        let b = table.admit(B).expect("b");
        for c in [&a1, &a2, &b] {
            c.connection().stalled();
        }
        a1.connection().begin_request();
        a2.connection().begin_request();
        // A's connections all carry requests: a busy client, not a slow one.
        let a3 = table.admit(A).expect("a free place");
        a3.connection().stalled();
        a3.connection().begin_request();
        assert!(!b.connection().evict.is_cancelled());
        assert_eq!(table.len(), 4);
        // At the cap a waiting connection still makes room, then nothing can.
        let _a4 = table.admit(A).expect("B's waiting connection makes room at the cap");
        assert!(b.connection().evict.is_cancelled());
        assert!(table.admit(A).is_none(), "every connection carries a request");
        assert!(table.admit(B).is_none(), "every connection carries a request");
    }

    #[test]
    fn a_connection_not_yet_read_is_never_closed_to_make_room() {
        let table = Connections::new(2, 2);
        let unread = table.admit(A).expect("unread");
        let slow = table.admit(A).expect("slow");
        slow.connection().stalled();
        let _third = table.admit(A).expect("the slow one makes room");
        assert!(slow.connection().evict.is_cancelled());
        assert!(!unread.connection().evict.is_cancelled());
        assert!(table.admit(A).is_none(), "nothing read yet is closable");
    }

    #[tokio::test]
    async fn room_waits_until_a_connection_closes_or_goes_idle() {
        let table = Connections::new(1, 1);
        let only = table.admit(A).expect("only");
        only.connection().stalled();
        only.connection().begin_request();
        let waiter = {
            let table = Arc::clone(&table);
            tokio::spawn(async move { table.room().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        only.connection().end_request();
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("woken")
            .expect("join");
    }
}
