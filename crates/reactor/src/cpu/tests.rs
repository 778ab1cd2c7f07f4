use super::*;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

// ---- cpulist ----

#[test]
fn cpu_lists_parse_ranges_singles_and_unsorted_duplicates() {
    assert_eq!(
        parse_cpu_list("0-3,8,10-11").unwrap(),
        vec![0, 1, 2, 3, 8, 10, 11]
    );
    assert_eq!(parse_cpu_list("3,1,1-2").unwrap(), vec![1, 2, 3]);
    assert!(parse_cpu_list("0-3, 8 ,\n").is_err());
    assert_eq!(parse_cpu_list(" 0-1 , 4 \n").unwrap(), vec![0, 1, 4]);
}

#[test]
fn a_single_cpu_parses_to_itself() {
    assert_eq!(parse_cpu_list("7").unwrap(), vec![7]);
    assert_eq!(parse_cpu_list("5-5").unwrap(), vec![5]);
}

#[test]
fn garbage_cpu_lists_are_rejected_with_the_input_in_the_error() {
    for bad in [
        "a", "1-", "-1", "3-1", "1,,2", "0-999999", "+1", "0x1", "1-2-3", "0:2", ",",
    ] {
        match parse_cpu_list(bad) {
            Err(CpuError::BadList { input, .. }) => assert_eq!(input, bad),
            other => panic!("{bad:?} gave {other:?}"),
        }
    }
}

#[test]
fn an_empty_cpu_list_is_rejected() {
    for empty in ["", " ", "\n"] {
        assert!(
            matches!(parse_cpu_list(empty), Err(CpuError::BadList { .. })),
            "{empty:?} was accepted"
        );
    }
}

#[test]
fn cpu_lists_format_compactly_and_round_trip() {
    assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    assert_eq!(format_cpu_list(&[11, 3, 2, 2, 10]), "2-3,10-11");
    assert_eq!(format_cpu_list(&[5]), "5");
    assert_eq!(format_cpu_list(&[]), "");
    let list = "0-2,4,6-9,63";
    assert_eq!(format_cpu_list(&parse_cpu_list(list).unwrap()), list);
}

// ---- topology ----

#[test]
fn synthetic_topology_numbers_first_threads_of_all_sockets_before_siblings() {
    let t = CpuTopology::synthetic(2, 56, 2);
    assert_eq!(t.cpus().len(), 224);
    assert_eq!(t.sockets(), vec![0, 1]);
    let c = |id| *t.cpu(id).unwrap();
    assert_eq!((c(0).socket, c(0).core, c(0).first_thread), (0, 0, true));
    assert_eq!(
        (c(55).socket, c(55).core, c(55).first_thread),
        (0, 55, true)
    );
    assert_eq!((c(56).socket, c(56).core, c(56).first_thread), (1, 0, true));
    assert_eq!(
        (c(112).socket, c(112).core, c(112).first_thread),
        (0, 0, false)
    );
    assert_eq!(
        (c(168).socket, c(168).core, c(168).first_thread),
        (1, 0, false)
    );
    assert_eq!(c(200).node, 1);
    let cores = t.physical_cores(None);
    assert_eq!(cores[&0], (0..56).collect::<Vec<u32>>());
    assert_eq!(cores[&1], (56..112).collect::<Vec<u32>>());
}

/// A sysfs tree in a unique temp directory, removed on drop.
struct FakeSys(PathBuf);

impl FakeSys {
    fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!(
            "carmine-sysfs-{name}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        let _ = std::fs::remove_dir_all(&root);
        Self(root)
    }

    fn write(&self, rel: &str, content: &str) {
        let path = self.0.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    /// Writes `devices/system/cpu/cpuN/topology/*` for one cpu.
    fn cpu(&self, id: u32, socket: &str, core: u32, siblings: &str) {
        let dir = format!("devices/system/cpu/cpu{id}/topology");
        self.write(
            &format!("{dir}/physical_package_id"),
            &format!("{socket}\n"),
        );
        self.write(&format!("{dir}/core_id"), &format!("{core}\n"));
        self.write(
            &format!("{dir}/thread_siblings_list"),
            &format!("{siblings}\n"),
        );
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for FakeSys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn fake_sysfs_with_intel_numbering_two_nodes_and_smt_is_read() {
    // 2 sockets × 2 cores × 2 threads: first threads 0-3, siblings 4-7 (cpu n+4 of cpu n).
    let sys = FakeSys::new("intel");
    sys.write("devices/system/cpu/online", "0-7\n");
    for id in 0..8u32 {
        let socket = (id % 4) / 2;
        let first = id % 4;
        sys.cpu(
            id,
            &socket.to_string(),
            id % 2,
            &format!("{first},{}", first + 4),
        );
    }
    sys.write("devices/system/node/node0/cpulist", "0-1,4-5\n");
    sys.write("devices/system/node/node1/cpulist", "2-3,6-7\n");
    sys.write("devices/system/node/node2/cpulist", "\n"); // memory-only node
    sys.write("devices/system/node/online", "0-2\n");
    let t = CpuTopology::from_sys_root(sys.path()).unwrap();
    assert_eq!(t.cpus().len(), 8);
    assert_eq!(t.sockets(), vec![0, 1]);
    let firsts: Vec<u32> = t
        .cpus()
        .iter()
        .filter(|c| c.first_thread)
        .map(|c| c.id)
        .collect();
    assert_eq!(firsts, vec![0, 1, 2, 3]);
    assert_eq!(t.cpu(6).unwrap().node, 1);
    assert_eq!(t.cpu(5).unwrap().node, 0);
    let cores = t.physical_cores(None);
    assert_eq!(cores[&0], vec![0, 1]);
    assert_eq!(cores[&1], vec![2, 3]);
}

#[test]
fn fake_sysfs_with_adjacent_smt_siblings_is_read_from_thread_siblings_list() {
    // AMD/ARM style: cpus 2k and 2k+1 share a core; cpu 5 is offline, so 4 is alone.
    let sys = FakeSys::new("amd");
    sys.write("devices/system/cpu/online", "0-4\n");
    for id in 0..5u32 {
        let first = id & !1;
        let siblings = if first == 4 {
            "4".to_string()
        } else {
            format!("{first}-{}", first + 1)
        };
        sys.cpu(id, "0", id / 2, &siblings);
    }
    let t = CpuTopology::from_sys_root(sys.path()).unwrap();
    assert_eq!(t.physical_cores(None)[&0], vec![0, 2, 4]);
    assert!(!t.cpu(1).unwrap().first_thread);
}

#[test]
fn missing_numa_directory_puts_every_cpu_on_node_0_and_unknown_package_on_socket_0() {
    let sys = FakeSys::new("nonuma");
    sys.write("devices/system/cpu/online", "0-1\n");
    sys.cpu(0, "-1", 0, "0");
    sys.cpu(1, "-1", 1, "1");
    let t = CpuTopology::from_sys_root(sys.path()).unwrap();
    assert!(t.cpus().iter().all(|c| c.node == 0 && c.socket == 0));
    assert_eq!(t.physical_cores(None)[&0], vec![0, 1]);
}

#[test]
fn broken_sysfs_content_is_an_error_naming_the_file_and_content() {
    let sys = FakeSys::new("bad");
    sys.write("devices/system/cpu/online", "0\n");
    sys.cpu(0, "zero", 0, "0");
    match CpuTopology::from_sys_root(sys.path()) {
        Err(CpuError::BadSysfs { path, content, .. }) => {
            assert!(path.ends_with("cpu0/topology/physical_package_id"));
            assert_eq!(content, "zero");
        }
        other => panic!("{other:?}"),
    }
    sys.write("devices/system/cpu/online", "0-x\n");
    let err = CpuTopology::from_sys_root(sys.path()).unwrap_err();
    assert!(
        err.to_string().contains("online") && err.to_string().contains("0-x"),
        "{err}"
    );
}

#[test]
fn a_siblings_list_without_the_cpu_itself_is_rejected() {
    let sys = FakeSys::new("siblings");
    sys.write("devices/system/cpu/online", "0\n");
    sys.cpu(0, "0", 0, "1");
    let err = CpuTopology::from_sys_root(sys.path()).unwrap_err();
    assert!(matches!(err, CpuError::BadSysfs { .. }), "{err}");
}

#[test]
fn a_missing_topology_file_is_a_read_error_naming_the_file() {
    let sys = FakeSys::new("missing");
    sys.write("devices/system/cpu/online", "0\n");
    match CpuTopology::from_sys_root(sys.path()) {
        Err(CpuError::Read { path, .. }) => assert!(path.ends_with("physical_package_id")),
        other => panic!("{other:?}"),
    }
    let empty = FakeSys::new("empty");
    assert!(matches!(
        CpuTopology::from_sys_root(empty.path()),
        Err(CpuError::Read { .. })
    ));
}

#[test]
fn this_machine_topology_contains_every_cpu_we_may_run_on() {
    let t = CpuTopology::from_sys().unwrap();
    assert!(!t.sockets().is_empty());
    let available = available_cpus();
    assert!(!available.is_empty());
    for c in &available {
        assert!(t.cpu(*c).is_some(), "cpu {c} missing from /sys topology");
    }
    // Every physical core has exactly one first thread.
    let firsts = t.cpus().iter().filter(|c| c.first_thread).count();
    assert!(firsts >= 1 && firsts <= t.cpus().len());
}

// ---- affinity ----

#[test]
fn pinning_restricts_the_thread_to_one_cpu() {
    let cpu = *current_thread_affinity().unwrap().last().unwrap();
    std::thread::spawn(move || {
        pin_current_thread(cpu).unwrap();
        assert_eq!(current_thread_affinity().unwrap(), vec![cpu]);
        // The process mask is the main thread's, untouched by pinning this thread.
        assert!(available_cpus().contains(&cpu));
    })
    .join()
    .unwrap();
}

#[test]
fn pinning_to_an_impossible_cpu_is_an_error_not_a_panic() {
    std::thread::spawn(|| {
        assert!(pin_current_thread(1 << 20).is_err());
    })
    .join()
    .unwrap();
}

// ---- policies on the seed blog's machine: 2 sockets × 56 cores, SMT 2; 8 OSDs × 5 ----

fn seed_machine() -> CpuTopology {
    CpuTopology::synthetic(2, 56, 2)
}

/// Every OSD has `reactors` cpus, all first threads, none used twice.
pub(super) fn assert_valid(topo: &CpuTopology, a: &Allocation, osds: u32, reactors: u32) {
    assert_eq!(a.osds(), osds);
    let mut seen = HashSet::new();
    for (o, cpus) in a.iter() {
        assert_eq!(cpus.len(), reactors as usize, "osd {o}");
        for c in cpus {
            assert!(
                topo.cpu(*c).unwrap().first_thread,
                "cpu {c} is an SMT sibling"
            );
            assert!(seen.insert(*c), "cpu {c} used twice");
        }
    }
}

fn range(lo: u32, n: u32) -> Vec<u32> {
    (lo..lo + n).collect()
}

#[test]
fn default_policy_gives_each_osd_the_next_contiguous_cores() {
    let t = seed_machine();
    let a = allocate(&t, CpuPolicy::Default, None, 8, 5, false).unwrap();
    assert_valid(&t, &a, 8, 5);
    for o in 0..8 {
        assert_eq!(a.cpus(o), range(5 * o, 5), "osd {o}");
    }
    assert!(!a.oversubscribed && !a.policies_coincide());
}

#[test]
fn osd_policy_puts_even_osds_on_socket_0_and_odd_osds_on_socket_1() {
    let t = seed_machine();
    let a = allocate(&t, CpuPolicy::Osd, None, 8, 5, false).unwrap();
    assert_valid(&t, &a, 8, 5);
    for o in 0..8 {
        let socket_base = if o % 2 == 0 { 0 } else { 56 };
        assert_eq!(a.cpus(o), range(socket_base + 5 * (o / 2), 5), "osd {o}");
    }
}

#[test]
fn socket_policy_splits_every_osd_three_on_socket_0_and_two_on_socket_1() {
    let t = seed_machine();
    let a = allocate(&t, CpuPolicy::Socket, None, 8, 5, false).unwrap();
    assert_valid(&t, &a, 8, 5);
    for o in 0..8 {
        let mut want = range(3 * o, 3);
        want.extend(range(56 + 2 * o, 2));
        assert_eq!(a.cpus(o), want, "osd {o}");
    }
}

#[test]
fn osd_policy_generalises_to_osd_id_modulo_the_number_of_sockets() {
    let t = CpuTopology::synthetic(4, 8, 1);
    let a = allocate(&t, CpuPolicy::Osd, None, 6, 2, false).unwrap();
    assert_valid(&t, &a, 6, 2);
    assert_eq!(a.cpus(3), &[24, 25]);
    assert_eq!(a.cpus(4), &[2, 3]);
    let s = allocate(&t, CpuPolicy::Socket, None, 2, 6, false).unwrap();
    assert_eq!(s.cpus(0), &[0, 1, 8, 9, 16, 24]);
    assert_eq!(s.cpus(1), &[2, 3, 10, 11, 17, 25]);
}

#[test]
fn the_allowed_cpu_set_restricts_every_policy_and_its_siblings_stay_unused() {
    // Reserve cores 0-7 and 56-63 (and all siblings but a few) for clients.
    let t = seed_machine();
    let mut allowed: Vec<u32> = (8..56).chain(64..112).collect();
    allowed.extend([112, 113, 200]); // siblings: allowed, but never used
    let d = allocate(&t, CpuPolicy::Default, Some(&allowed), 8, 5, false).unwrap();
    assert_eq!(d.cpus(0), range(8, 5));
    assert_eq!(d.cpus(7), range(8 + 35, 5));
    let o = allocate(&t, CpuPolicy::Osd, Some(&allowed), 8, 5, false).unwrap();
    assert_eq!(o.cpus(0), range(8, 5));
    assert_eq!(o.cpus(1), range(64, 5));
    let s = allocate(&t, CpuPolicy::Socket, Some(&allowed), 8, 5, false).unwrap();
    assert_eq!(s.cpus(0), [8, 9, 10, 64, 65]);
    for a in [&d, &o, &s] {
        assert_valid(&t, a, 8, 5);
        assert!(a.iter().flat_map(|(_, c)| c).all(|c| allowed.contains(c)));
    }
    assert!(d.grid(&t).contains("- = outside"));
}

#[test]
fn an_allowed_set_on_one_socket_makes_osd_policy_use_only_that_socket() {
    let t = seed_machine();
    let allowed: Vec<u32> = (56..112).collect();
    let a = allocate(&t, CpuPolicy::Osd, Some(&allowed), 2, 3, false).unwrap();
    assert_eq!(
        (a.cpus(0), a.cpus(1)),
        (&[56, 57, 58][..], &[59, 60, 61][..])
    );
    assert!(a.policies_coincide());
}

#[test]
fn an_allowed_set_naming_offline_cpus_is_rejected() {
    let t = CpuTopology::synthetic(1, 2, 1);
    let err = allocate(&t, CpuPolicy::Default, Some(&[1, 2, 3]), 1, 1, true).unwrap_err();
    assert!(
        matches!(&err, CpuError::NotOnline { cpus, .. } if cpus == "2-3"),
        "{err}"
    );
}

#[test]
fn too_few_cores_is_an_error_saying_how_many_were_needed_and_available() {
    let t = CpuTopology::synthetic(1, 2, 2); // 2 physical cores, 4 threads
    let err = allocate(&t, CpuPolicy::Default, None, 2, 2, false).unwrap_err();
    match &err {
        CpuError::NotEnoughCores {
            needed, available, ..
        } => assert_eq!((*needed, *available), (4, 2)),
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("4 needed, 2 available"), "{err}");
}

#[test]
fn osd_policy_reports_the_socket_that_ran_out_even_if_the_total_fits() {
    let t = CpuTopology::synthetic(2, 6, 1);
    assert!(allocate(&t, CpuPolicy::Default, None, 3, 4, false).is_ok());
    // OSDs 0 and 2 both go to socket 0: 8 reactors for 6 cores.
    let err = allocate(&t, CpuPolicy::Osd, None, 3, 4, false).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("on socket 0") && msg.contains("8 needed, 6 available"),
        "{msg}"
    );
}

#[test]
fn oversubscribing_wraps_around_round_robin_and_is_recorded() {
    let laptop = CpuTopology::synthetic(1, 2, 1);
    for policy in CpuPolicy::ALL {
        let a = allocate(&laptop, policy, None, 3, 2, true).unwrap();
        assert!(a.oversubscribed);
        assert_eq!(
            (a.cpus(0), a.cpus(1), a.cpus(2)),
            (&[0, 1][..], &[0, 1][..], &[0, 1][..])
        );
        let grid = a.grid(&laptop);
        assert!(
            grid.contains("OVERSUBSCRIBED") && grid.contains("0.0+2"),
            "{grid}"
        );
    }
    let odd = allocate(&laptop, CpuPolicy::Default, None, 3, 1, true).unwrap();
    assert_eq!(
        (odd.cpus(0), odd.cpus(1), odd.cpus(2)),
        (&[0][..], &[1][..], &[0][..])
    );
    // What an OSD asks before it polls: cpu 0 carries two reactors, cpu 1 one.
    assert_eq!((odd.reactors_on(0), odd.reactors_on(1)), (2, 1));
    assert_eq!(odd.reactors_on(7), 0);
}

#[test]
fn a_request_that_fits_is_not_marked_oversubscribed_even_when_allowed() {
    let t = CpuTopology::synthetic(1, 4, 2);
    let a = allocate(&t, CpuPolicy::Default, None, 2, 2, true).unwrap();
    assert!(!a.oversubscribed);
    assert_valid(&t, &a, 2, 2);
}

#[test]
fn no_usable_core_is_an_error_even_when_oversubscribing() {
    let t = CpuTopology::synthetic(1, 2, 2);
    let siblings_only = [2, 3];
    for policy in CpuPolicy::ALL {
        let err = allocate(&t, policy, Some(&siblings_only), 1, 1, true).unwrap_err();
        assert!(err.to_string().contains("1 needed, 0 available"), "{err}");
    }
}

#[test]
fn zero_osds_or_zero_reactors_give_an_empty_allocation() {
    let t = CpuTopology::synthetic(2, 2, 1);
    let none = allocate(&t, CpuPolicy::Socket, None, 0, 4, false).unwrap();
    assert_eq!((none.osds(), none.cpus(0)), (0, &[][..]));
    let idle = allocate(&t, CpuPolicy::Osd, None, 3, 0, false).unwrap();
    assert_eq!(idle.osds(), 3);
    assert!(idle.iter().all(|(_, c)| c.is_empty()));
}

#[test]
fn one_socket_makes_all_policies_coincide_and_says_so() {
    let t = CpuTopology::synthetic(1, 4, 2);
    let results: Vec<Vec<Vec<u32>>> = CpuPolicy::ALL
        .iter()
        .map(|p| {
            let a = allocate(&t, *p, None, 2, 2, false).unwrap();
            assert!(a.policies_coincide_note().is_some());
            a.iter().map(|(_, c)| c.to_vec()).collect()
        })
        .collect();
    assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
    let two = allocate(&seed_machine(), CpuPolicy::Osd, None, 2, 2, false).unwrap();
    assert_eq!(two.policies_coincide_note(), None);
}

#[test]
fn policy_names_round_trip_and_unknown_names_are_rejected() {
    for p in CpuPolicy::ALL {
        assert_eq!(p.to_string().parse::<CpuPolicy>().unwrap(), p);
    }
    assert_eq!(CpuPolicy::default(), CpuPolicy::Default);
    assert!(matches!("numa".parse::<CpuPolicy>(), Err(CpuError::BadPolicy(n)) if n == "numa"));
}

// ---- grid ----

#[test]
fn the_grid_has_a_policy_header_and_one_wrapped_row_pair_per_socket() {
    let t = seed_machine();
    let a = allocate(&t, CpuPolicy::Osd, None, 8, 5, false).unwrap();
    let grid = a.grid(&t);
    let lines: Vec<&str> = grid.lines().collect();
    assert!(
        lines[0].starts_with("cpu policy osd: 8 OSDs x 5 reactors"),
        "{grid}"
    );
    // 56 cores per socket in rows of 28: 2 chunks × (cells + cpu ids) × 2 sockets.
    assert_eq!(lines.len(), 1 + 2 * 2 * 2, "{grid}");
    assert!(lines[1].starts_with("socket 0 | 0.0 0.1 0.2"), "{grid}");
    assert!(lines[2].starts_with("     cpu |   0   1   2"), "{grid}");
    assert!(lines[5].starts_with("socket 1 | 1.0 1.1"), "{grid}");
    assert!(lines.iter().all(|l| l.len() < 200), "{grid}");
    // Cell of OSD 7's last reactor: socket 1, cpu 56 + 15 + 4 = 75, in socket 1's first row.
    let cells: Vec<&str> = lines[5]
        .split('|')
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    let ids: Vec<&str> = lines[6]
        .split('|')
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    let col = ids.iter().position(|c| *c == "75").unwrap();
    assert_eq!(cells[col], "7.4");
    assert_eq!(cells[col + 1], ".");
}

#[test]
fn the_grid_notes_when_policies_coincide() {
    let t = CpuTopology::synthetic(1, 2, 1);
    let grid = allocate(&t, CpuPolicy::Socket, None, 1, 2, false)
        .unwrap()
        .grid(&t);
    assert!(
        grid.contains("same placement") && grid.contains("0.1"),
        "{grid}"
    );
}
