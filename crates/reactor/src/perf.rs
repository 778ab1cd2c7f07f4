//! The perf socket: a Unix socket where a daemon hands out its reactors' load counters as one
//! JSON document per connection (connect, read to EOF). Served by a plain thread, never a
//! reactor, so reading it cannot disturb the I/O path beyond the relaxed counter loads.

use crate::{LoadSnapshot, ReactorLoad};
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Bumped when a field changes meaning; readers refuse versions they do not know.
pub const PERF_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PerfDump {
    pub version: u32,
    pub reactors: Vec<ReactorPerf>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReactorPerf {
    pub name: String,
    pub load: LoadSnapshot,
}

/// A serving perf socket; dropping it stops the thread and removes the socket file.
pub struct PerfSocket {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    join: Option<std::thread::JoinHandle<()>>,
}

/// Serves `reactors`' counters at `path` (an existing socket file there is replaced).
pub fn serve_perf_socket(
    path: &Path,
    reactors: Vec<(String, Arc<ReactorLoad>)>,
) -> io::Result<PerfSocket> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let join = std::thread::Builder::new()
        .name("perf-socket".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                let dump = PerfDump {
                    version: PERF_VERSION,
                    reactors: reactors
                        .iter()
                        .map(|(name, load)| ReactorPerf {
                            name: name.clone(),
                            load: load.snapshot(),
                        })
                        .collect(),
                };
                if let Ok(json) = serde_json::to_vec(&dump) {
                    // A reader that went away is its own problem.
                    let _ = conn.write_all(&json);
                }
            }
        })?;
    Ok(PerfSocket {
        path: path.to_path_buf(),
        stop,
        join: Some(join),
    })
}

impl Drop for PerfSocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept.
        let _ = UnixStream::connect(&self.path);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads one dump from the perf socket at `path`.
pub fn read_perf_socket(path: &Path) -> io::Result<PerfDump> {
    let conn = UnixStream::connect(path)?;
    conn.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
    let mut buf = Vec::new();
    conn.take(1 << 20).read_to_end(&mut buf)?;
    let dump: PerfDump =
        serde_json::from_slice(&buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if dump.version != PERF_VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "perf socket version {} (this build reads {PERF_VERSION})",
                dump.version
            ),
        ));
    }
    Ok(dump)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_round_trips_and_the_socket_goes_away_on_drop() {
        let path = std::env::temp_dir().join(format!("carmine-perf-{}.sock", std::process::id()));
        let load = Arc::new(ReactorLoad::default());
        let sock = serve_perf_socket(&path, vec![("osd0-r0".into(), load.clone())]).unwrap();
        let d = read_perf_socket(&path).unwrap();
        assert_eq!(d.version, PERF_VERSION);
        assert_eq!(d.reactors.len(), 1);
        assert_eq!(d.reactors[0].name, "osd0-r0");
        assert_eq!(d.reactors[0].load, load.snapshot());
        drop(sock);
        assert!(!path.exists());
        assert!(read_perf_socket(&path).is_err());
    }

    #[test]
    fn unknown_versions_and_garbage_are_refused() {
        let path =
            std::env::temp_dir().join(format!("carmine-perf-bad-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            for (i, c) in listener.incoming().take(2).enumerate() {
                let body: &[u8] = if i == 0 {
                    br#"{"version":99,"reactors":[]}"#
                } else {
                    b"not json"
                };
                c.unwrap().write_all(body).unwrap();
            }
        });
        let e = read_perf_socket(&path).unwrap_err();
        assert!(e.to_string().contains("version 99"), "{e}");
        assert!(read_perf_socket(&path).is_err());
        t.join().unwrap();
        let _ = std::fs::remove_file(&path);
    }
}
