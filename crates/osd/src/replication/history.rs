//! The PG histories in the map store, seen from the reactors: the store's calls block (etcd
//! over HTTP, or a file under a lock), so one worker thread per OSD makes them, and each
//! reactor gets the answers in its own mailbox. A reactor never waits on one: a PG whose
//! history has not come yet simply does not peer yet.

use carmine_mapstore::{PgHistoryStore, Recorded};
use carmine_pg::Interval;
use carmine_reactor::MailboxSender;
use carmine_types::{OsdId, PgId};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::time::Duration;

/// Requests queued for the worker; past it a reactor tries again on its next tick.
const QUEUE: usize = 4096;
/// Answers a reactor's mailbox holds before the worker waits for it to take some.
pub(crate) const ANSWERS: usize = 1024;

pub type SharedHistoryStore = Arc<dyn PgHistoryStore + Send + Sync>;

/// Removes a PG's temporary acting set from the map (decision 0015, step 4).
pub trait ReleaseTemp: std::fmt::Debug + Send + Sync {
    /// Removes the temporary acting sets of `sets` in one new map epoch: each PG's once its
    /// primary, serving from `acting`, filled the backfill targets `filled`
    /// (`OsdMap::release_temp` says when it may; a set the map moved on from stays). Returns
    /// how many went. Called on the map store's worker thread.
    fn release(&self, sets: &[TempFilled]) -> Result<usize, String>;
}

/// A PG whose backfill targets are full: (pg, the acting set it serves from, the targets).
pub type TempFilled = (PgId, Vec<OsdId>, Vec<OsdId>);

pub type TempReleaser = Arc<dyn ReleaseTemp>;

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
    /// `asked` temporary acting sets were asked about; of the batch they went in (every
    /// reactor's asks merged), `released` went.
    Released {
        asked: usize,
        released: usize,
    },
    /// The map store could not release them: asked again later.
    ReleaseFailed {
        pgs: Vec<PgId>,
        why: String,
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
    /// The releasing worker's queue; `None` if this OSD cannot change the map.
    releases: Option<SyncSender<(usize, Vec<TempFilled>)>>,
}

impl HistoryClient {
    /// False if the worker's queue is full or it is gone: ask again later.
    pub fn ask(&self, ask: Ask) -> bool {
        self.tx.try_send((self.reactor, ask)).is_ok()
    }

    /// Asks for the temporary acting sets of PGs whose primaries filled their backfill
    /// targets to go, in one map epoch (each epoch costs every OSD a look at every PG, and
    /// OSDs that miss one peer all theirs again). False as for [`HistoryClient::ask`], or if
    /// this OSD cannot change the map.
    pub fn release(&self, sets: Vec<TempFilled>) -> bool {
        self.releases
            .as_ref()
            .is_some_and(|tx| tx.try_send((self.reactor, sets)).is_ok())
    }

    /// Whether this OSD may release temporary acting sets (it has a way to change the map).
    pub fn can_release(&self) -> bool {
        self.releases.is_some()
    }
}

/// Starts the workers for `reactors` (one answer mailbox each); returns each reactor's
/// client. Releases of temporary acting sets get a worker of their own: each waits for the
/// map to be quiet and then changes it, which takes up to seconds, and the histories' worker
/// answers peering meanwhile.
pub(crate) fn start(
    store: SharedHistoryStore,
    release: Option<TempReleaser>,
    mut reactors: Vec<MailboxSender<Answer>>,
) -> std::io::Result<Vec<HistoryClient>> {
    let (tx, rx) = sync_channel::<(usize, Ask)>(QUEUE);
    let releases = match release {
        Some(r) => Some(start_releases(r, reactors.clone())?),
        None => None,
    };
    let clients = (0..reactors.len())
        .map(|reactor| HistoryClient {
            reactor,
            tx: tx.clone(),
            releases: releases.clone(),
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

/// Pause after a failed release before the next one, doubled at each failure in a row: the
/// map store may be down, and every reactor asks again at once.
const RELEASE_BACKOFF_MIN: Duration = Duration::from_millis(500);
const RELEASE_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// The releasing worker: the sets every reactor asked about meanwhile go in one map update.
fn start_releases(
    release: TempReleaser,
    mut reactors: Vec<MailboxSender<Answer>>,
) -> std::io::Result<SyncSender<(usize, Vec<TempFilled>)>> {
    let (tx, rx) = sync_channel::<(usize, Vec<TempFilled>)>(reactors.len() * 4);
    std::thread::Builder::new()
        .name("pg-temp-release".into())
        .spawn(move || {
            let mut backoff = RELEASE_BACKOFF_MIN;
            while let Ok(first) = rx.recv() {
                let mut asks = vec![first];
                asks.extend(rx.try_iter());
                let sets: Vec<TempFilled> =
                    asks.iter().flat_map(|(_, s)| s.iter().cloned()).collect();
                let result = release.release(&sets);
                let failed = result.is_err();
                for (reactor, asked) in asks {
                    let answer = match &result {
                        // How many went is known for the whole batch only: each reactor
                        // hears it, with its own count of sets asked about.
                        Ok(released) => Answer::Released {
                            asked: asked.len(),
                            released: *released,
                        },
                        Err(why) => Answer::ReleaseFailed {
                            pgs: asked.iter().map(|s| s.0).collect(),
                            why: why.clone(),
                        },
                    };
                    // A reactor that stopped takes no answer; the others may still ask.
                    let _ = reactors[reactor].send_blocking(answer);
                }
                if failed {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(RELEASE_BACKOFF_MAX);
                } else {
                    backoff = RELEASE_BACKOFF_MIN;
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
    };
    answered.unwrap_or_else(|e| Answer::Failed {
        pg,
        epoch,
        why: e.to_string(),
    })
}
