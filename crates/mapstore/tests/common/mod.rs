//! Shared by the map-store tests: a temporary directory, and the private etcd in it, both gone
//! when the test is.
#![allow(dead_code)]

use carmine_mapstore::PrivateEtcd;
use std::path::PathBuf;

pub struct TestDir {
    pub dir: PathBuf,
    pub etcd: Option<PrivateEtcd>,
}

impl TestDir {
    /// An empty directory for test `name` of suite `suite`.
    pub fn new(suite: &str, name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("carmine-{suite}-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TestDir { dir, etcd: None }
    }

    /// The same, with a private etcd running in it.
    pub fn with_etcd(suite: &str, name: &str) -> Self {
        let mut t = Self::new(suite, name);
        t.etcd = Some(PrivateEtcd::start(&t.dir).expect(
            "these tests need etcd (Debian: apt-get install etcd-server; .ci/run installs it)",
        ));
        t
    }

    pub fn endpoint(&self) -> String {
        self.etcd.as_ref().expect("an etcd").endpoint().to_owned()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        // etcd first: it writes into the directory until it is gone.
        self.etcd.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
