//! The PG histories in the map store, seen from the reactors: the store's calls block (etcd
//! over HTTP, or a file under a lock), so one worker thread per OSD makes them, and each
//! reactor gets the answers in its own mailbox. A reactor never waits on one: a PG whose
//! history has not come yet simply does not peer yet.

use carmine_mapstore::{PgHistoryStore, Recorded};
use carmine_pg::Interval;
use carmine_reactor::MailboxSender;
use carmine_types::{OsdId, PgId, PoolId};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::time::Duration;

/// Requests queued for the worker; past it a reactor tries again on its next tick.
const QUEUE: usize = 4096;
/// Answers a reactor's mailbox holds before the worker waits for it to take some.
pub(crate) const ANSWERS: usize = 1024;

pub type SharedHistoryStore = Arc<dyn PgHistoryStore + Send + Sync>;

/// A change to a PG's temporary acting set that its primary asks for (decision 0015).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TempChange {
    /// Serve `pg` from `set`, a part of the acting set `acting` it is served from now, while
    /// the others fill as backfill targets: they lack most of it (`OsdMap::ask_temp`).
    Ask {
        pg: PgId,
        acting: Vec<OsdId>,
        set: Vec<OsdId>,
    },
    /// `pg`'s temporary acting set may go: served from `acting`, its primary filled the
    /// backfill targets `filled` (`OsdMap::release_temp`).
    Release {
        pg: PgId,
        acting: Vec<OsdId>,
        filled: Vec<OsdId>,
    },
}

impl TempChange {
    pub fn pg(&self) -> PgId {
        match self {
            TempChange::Ask { pg, .. } | TempChange::Release { pg, .. } => *pg,
        }
    }
}

/// Changes PGs' temporary acting sets in the map (decision 0015, steps 2 and 4).
pub trait ChangeTemps: std::fmt::Debug + Send + Sync {
    /// Makes `changes` in one new map epoch, each only if the map still serves its PG as its
    /// primary saw it (a change the map moved on from is dropped). Returns how many were
    /// made. Called on a worker thread of its own.
    fn change(&self, changes: &[TempChange]) -> Result<usize, String>;
}

pub type TempChanger = Arc<dyn ChangeTemps>;

#[derive(Debug)]
pub(crate) enum Ask {
    Get {
        pg: PgId,
        epoch: u32,
    },
    Record {
        pg: PgId,
        epoch: u32,
        after: Option<u32>,
        interval: Interval,
    },
    /// The PG is clean in `epoch` on an interval that began in `from`: the intervals
    /// before its recorded one may go.
    Settle {
        pg: PgId,
        from: u32,
        epoch: u32,
    },
    /// The histories of every PG of `pool` may go: the map removed it, and this reactor's
    /// copies of its PGs stopped (asked after whatever they asked, so it removes what they
    /// recorded).
    ForgetPool {
        pool: PoolId,
    },
}

#[derive(Debug)]
pub(crate) enum Answer {
    /// The PG's history, asked for in `epoch`.
    Got {
        pg: PgId,
        epoch: u32,
        history: Vec<Interval>,
    },
    Recorded {
        pg: PgId,
        epoch: u32,
    },
    Changed {
        pg: PgId,
        epoch: u32,
        history: Vec<Interval>,
    },
    Settled {
        pg: PgId,
    },
    /// `asked` changes of temporary acting sets were asked for; of the batch they went in
    /// (every reactor's asks merged), `made` were made.
    TempsChanged {
        asked: usize,
        made: usize,
    },
    /// The map store could not make them: asked again later.
    TempChangeFailed {
        pgs: Vec<PgId>,
        why: String,
    },
    /// The histories of removed pool `pool` are gone (how many), or why not.
    PoolForgotten {
        pool: PoolId,
        removed: Result<u64, String>,
    },
    /// The map store could not answer (unreachable, damaged record): asked again later.
    Failed {
        pg: PgId,
        epoch: u32,
        why: String,
    },
}

/// A reactor's handle on the workers.
#[derive(Clone)]
pub(crate) struct HistoryClient {
    reactor: usize,
    tx: SyncSender<(usize, Ask)>,
    /// The temporary sets' worker's queue; `None` if this OSD cannot change the map.
    temps: Option<SyncSender<(usize, Vec<TempChange>)>>,
}

impl HistoryClient {
    /// False if the worker's queue is full or it is gone: ask again later.
    pub fn ask(&self, ask: Ask) -> bool {
        self.tx.try_send((self.reactor, ask)).is_ok()
    }

    /// Asks for changes of temporary acting sets, made in one map epoch with those other
    /// reactors ask for meanwhile (each epoch costs every OSD a look at every PG, and OSDs
    /// that miss one peer all theirs again). False as for [`HistoryClient::ask`], or if this
    /// OSD cannot change the map.
    pub fn change_temps(&self, changes: Vec<TempChange>) -> bool {
        self.temps
            .as_ref()
            .is_some_and(|tx| tx.try_send((self.reactor, changes)).is_ok())
    }

    /// Whether this OSD may change temporary acting sets (it has a way to change the map).
    pub fn can_change_temps(&self) -> bool {
        self.temps.is_some()
    }
}

/// Starts the workers for `reactors` (one answer mailbox each); returns each reactor's
/// client. Changes of temporary acting sets get a worker of their own: each waits for the
/// map to be quiet and then changes it, which takes up to seconds, and the histories' worker
/// answers peering meanwhile.
pub(crate) fn start(
    store: SharedHistoryStore,
    temps: Option<TempChanger>,
    mut reactors: Vec<MailboxSender<Answer>>,
) -> std::io::Result<Vec<HistoryClient>> {
    let (tx, rx) = sync_channel::<(usize, Ask)>(QUEUE);
    let temps = match temps {
        Some(t) => Some(start_temps(t, reactors.clone())?),
        None => None,
    };
    let clients = (0..reactors.len())
        .map(|reactor| HistoryClient {
            reactor,
            tx: tx.clone(),
            temps: temps.clone(),
        })
        .collect();
    std::thread::Builder::new()
        .name("pg-history".into())
        .spawn(move || {
            // Ends when every reactor's client is gone (the OSD stopped).
            while let Ok((reactor, ask)) = rx.recv() {
                let answer = answer(store.as_ref(), ask);
                if reactors[reactor].send_blocking(answer).is_err() {
                    // That reactor stopped; the others may still ask.
                    continue;
                }
            }
        })?;
    Ok(clients)
}

/// Pause after a failed change before the next one, doubled at each failure in a row: the
/// map store may be down, and every reactor asks again at once.
const CHANGE_BACKOFF_MIN: Duration = Duration::from_millis(500);
const CHANGE_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// The temporary sets' worker: the changes every reactor asked for meanwhile go in one map
/// update.
fn start_temps(
    temps: TempChanger,
    mut reactors: Vec<MailboxSender<Answer>>,
) -> std::io::Result<SyncSender<(usize, Vec<TempChange>)>> {
    let (tx, rx) = sync_channel::<(usize, Vec<TempChange>)>(reactors.len() * 4);
    std::thread::Builder::new()
        .name("pg-temp".into())
        .spawn(move || {
            let mut backoff = CHANGE_BACKOFF_MIN;
            while let Ok(first) = rx.recv() {
                let mut asks = vec![first];
                asks.extend(rx.try_iter());
                let changes: Vec<TempChange> =
                    asks.iter().flat_map(|(_, c)| c.iter().cloned()).collect();
                let result = temps.change(&changes);
                let failed = result.is_err();
                for (reactor, asked) in asks {
                    let answer = match &result {
                        // How many were made is known for the whole batch only: each reactor
                        // hears it, with its own count of changes asked for.
                        Ok(made) => Answer::TempsChanged {
                            asked: asked.len(),
                            made: *made,
                        },
                        Err(why) => Answer::TempChangeFailed {
                            pgs: asked.iter().map(TempChange::pg).collect(),
                            why: why.clone(),
                        },
                    };
                    // A reactor that stopped takes no answer; the others may still ask.
                    let _ = reactors[reactor].send_blocking(answer);
                }
                if failed {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(CHANGE_BACKOFF_MAX);
                } else {
                    backoff = CHANGE_BACKOFF_MIN;
                }
            }
        })?;
    Ok(tx)
}

fn answer(store: &(dyn PgHistoryStore + Send + Sync), ask: Ask) -> Answer {
    let (pg, epoch) = match &ask {
        Ask::Get { pg, epoch } | Ask::Record { pg, epoch, .. } | Ask::Settle { pg, epoch, .. } => {
            (*pg, *epoch)
        }
        Ask::ForgetPool { pool } => {
            return Answer::PoolForgotten {
                pool: *pool,
                removed: store.remove_pool(*pool).map_err(|e| e.to_string()),
            }
        }
    };
    let answered = match ask {
        Ask::Get { .. } => store.get(pg).map(|h| Answer::Got {
            pg,
            epoch,
            history: h.intervals,
        }),
        Ask::Record {
            after, interval, ..
        } => store
            .record(pg, after, interval.clone())
            .map(|recorded| match recorded {
                Recorded::Done => Answer::Recorded { pg, epoch },
                // An earlier attempt of the same record made it (its answer was lost).
                Recorded::Changed(h) if h.intervals.last() == Some(&interval) => {
                    Answer::Recorded { pg, epoch }
                }
                Recorded::Changed(h) => Answer::Changed {
                    pg,
                    epoch,
                    history: h.intervals,
                },
            }),
        Ask::Settle { from, .. } => store
            .settle(pg, from, epoch)
            .map(|_| Answer::Settled { pg }),
        Ask::ForgetPool { .. } => unreachable!("answered above"),
    };
    answered.unwrap_or_else(|e| Answer::Failed {
        pg,
        epoch,
        why: e.to_string(),
    })
}
