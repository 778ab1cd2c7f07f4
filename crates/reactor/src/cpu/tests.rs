use super::*;
use std::collections::HashSet;

#[test]
fn cpu_lists_parse_ranges_and_singles() {
    assert_eq!(
        parse_cpu_list("0-3,8,10-11").unwrap(),
        vec![0, 1, 2, 3, 8, 10, 11]
    );
    assert_eq!(parse_cpu_list(" 1 ").unwrap(), vec![1]);
    assert_eq!(parse_cpu_list("3,1,1-2").unwrap(), vec![1, 2, 3]);
}

#[test]
fn garbage_cpu_lists_are_rejected() {
    for bad in ["", "a", "1-", "3-1", "1,,2", "0-999999"] {
        assert!(parse_cpu_list(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn cpu_lists_format_compactly() {
    assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    assert_eq!(format_cpu_list(&[]), "");
}

fn assert_valid(topo: &CpuTopology, a: &Allocation, osds: u32, reactors: u32) {
    let primaries: HashSet<u32> = topo
        .physical_cores(None)
        .values()
        .flatten()
        .copied()
        .collect();
    let mut seen = HashSet::new();
    for o in 0..osds {
        assert_eq!(a.cpus(o).len(), reactors as usize, "osd {o}");
        for c in a.cpus(o) {
            assert!(primaries.contains(c), "cpu {c} is an SMT sibling");
            assert!(seen.insert(*c), "cpu {c} used twice");
        }
    }
}

fn socket_of(topo: &CpuTopology, cpu: u32) -> u32 {
    topo.cpus().iter().find(|c| c.id == cpu).unwrap().socket
}

/// The seed blog's machine: 2 sockets × 56 cores with SMT, 8 OSDs × 5 reactors.
#[test]
fn default_policy_is_contiguous_from_the_first_core() {
    let t = CpuTopology::synthetic(2, 56, 2);
    let a = allocate(&t, CpuPolicy::Default, None, 8, 5, false).unwrap();
    assert_valid(&t, &a, 8, 5);
    assert_eq!(a.cpus(0), &[0, 1, 2, 3, 4]);
    assert_eq!(a.cpus(7), &[35, 36, 37, 38, 39]);
}

#[test]
fn osd_policy_keeps_each_osd_on_one_socket_alternating() {
    let t = CpuTopology::synthetic(2, 56, 2);
    let a = allocate(&t, CpuPolicy::Osd, None, 8, 5, false).unwrap();
    assert_valid(&t, &a, 8, 5);
    for o in 0..8 {
        let sockets: HashSet<u32> = a.cpus(o).iter().map(|c| socket_of(&t, *c)).collect();
        assert_eq!(sockets, HashSet::from([o % 2]), "osd {o}");
    }
    assert_eq!(a.cpus(0), &[0, 1, 2, 3, 4]);
    assert_eq!(a.cpus(1), &[56, 57, 58, 59, 60]);
    assert_eq!(a.cpus(2), &[5, 6, 7, 8, 9]);
}

#[test]
fn socket_policy_splits_every_osd_over_both_sockets() {
    let t = CpuTopology::synthetic(2, 56, 2);
    let a = allocate(&t, CpuPolicy::Socket, None, 8, 5, false).unwrap();
    assert_valid(&t, &a, 8, 5);
    for o in 0..8 {
        let on0 = a.cpus(o).iter().filter(|c| socket_of(&t, **c) == 0).count();
        assert_eq!((on0, 5 - on0), (3, 2), "osd {o}");
    }
    assert_eq!(a.cpus(0), &[0, 1, 2, 56, 57]);
}

#[test]
fn allowed_set_restricts_placement() {
    let t = CpuTopology::synthetic(1, 8, 1);
    let a = allocate(&t, CpuPolicy::Default, Some(&[4, 5, 6, 7]), 2, 2, false).unwrap();
    assert_eq!(a.cpus(0), &[4, 5]);
    assert_eq!(a.cpus(1), &[6, 7]);
}

#[test]
fn smt_siblings_are_never_used_even_if_allowed() {
    let t = CpuTopology::synthetic(1, 2, 2); // cpus 0,1 first threads; 2,3 siblings
    let a = allocate(&t, CpuPolicy::Default, None, 1, 2, false).unwrap();
    assert_eq!(a.cpus(0), &[0, 1]);
    assert!(allocate(&t, CpuPolicy::Default, None, 1, 3, false).is_err());
}

#[test]
fn too_few_cores_is_a_clear_error_unless_oversubscribing() {
    let t = CpuTopology::synthetic(1, 2, 1);
    let err = allocate(&t, CpuPolicy::Default, None, 2, 2, false).unwrap_err();
    assert!(
        err.to_string().contains("4 needed") && err.to_string().contains("2 available"),
        "{err}"
    );
    let a = allocate(&t, CpuPolicy::Default, None, 2, 2, true).unwrap();
    assert!(a.oversubscribed);
    assert_eq!(a.cpus(1), &[0, 1]);
}

#[test]
fn one_socket_makes_all_policies_coincide() {
    let t = CpuTopology::synthetic(1, 4, 1);
    let results: Vec<Vec<Vec<u32>>> = [CpuPolicy::Default, CpuPolicy::Osd, CpuPolicy::Socket]
        .iter()
        .map(|p| {
            let a = allocate(&t, *p, None, 2, 2, false).unwrap();
            assert!(a.policies_coincide());
            (0..2).map(|o| a.cpus(o).to_vec()).collect()
        })
        .collect();
    assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
    let grid = allocate(&t, CpuPolicy::Osd, None, 2, 2, false)
        .unwrap()
        .grid(&t);
    assert!(
        grid.contains("same placement") && grid.contains("1.1"),
        "{grid}"
    );
}

#[test]
fn policy_names_round_trip() {
    for p in [CpuPolicy::Default, CpuPolicy::Osd, CpuPolicy::Socket] {
        assert_eq!(p.to_string().parse::<CpuPolicy>().unwrap(), p);
    }
    assert!("numa".parse::<CpuPolicy>().is_err());
}

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

#[test]
fn fake_sysfs_tree_with_smt_and_two_nodes_is_read() {
    let root = std::env::temp_dir().join(format!("carmine-sysfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // 2 sockets × 2 cores × 2 threads; cpu ids: first threads 0-3, siblings 4-7.
    write(&root.join("devices/system/cpu/online"), "0-7\n");
    for id in 0..8u32 {
        let socket = (id % 4) / 2;
        let core = id % 2;
        let t = root.join(format!("devices/system/cpu/cpu{id}/topology"));
        write(&t.join("physical_package_id"), &format!("{socket}\n"));
        write(&t.join("core_id"), &format!("{core}\n"));
    }
    write(&root.join("devices/system/node/node0/cpulist"), "0-1,4-5\n");
    write(&root.join("devices/system/node/node1/cpulist"), "2-3,6-7\n");
    let t = CpuTopology::from_sys_root(&root).unwrap();
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(t.cpus().len(), 8);
    assert_eq!(t.sockets(), vec![0, 1]);
    assert_eq!(t.cpus()[6].node, 1);
    let cores = t.physical_cores(None);
    assert_eq!(cores[&0], vec![0, 1]);
    assert_eq!(cores[&1], vec![2, 3]);
}

#[test]
fn broken_sysfs_content_is_an_error() {
    let root = std::env::temp_dir().join(format!("carmine-sysfs-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    write(&root.join("devices/system/cpu/online"), "0\n");
    write(
        &root.join("devices/system/cpu/cpu0/topology/physical_package_id"),
        "zero\n",
    );
    write(
        &root.join("devices/system/cpu/cpu0/topology/core_id"),
        "0\n",
    );
    let err = CpuTopology::from_sys_root(&root).unwrap_err();
    std::fs::remove_dir_all(&root).unwrap();
    assert!(matches!(err, CpuError::BadSysfs { .. }), "{err}");
}

#[test]
fn this_machine_topology_covers_the_cpus_we_may_use() {
    let t = CpuTopology::from_sys().unwrap();
    let ids: HashSet<u32> = t.cpus().iter().map(|c| c.id).collect();
    for c in current_thread_affinity().unwrap() {
        assert!(ids.contains(&c), "cpu {c} missing from /sys topology");
    }
}

#[test]
fn pinning_restricts_the_thread_to_one_cpu() {
    let cpu = *current_thread_affinity().unwrap().last().unwrap();
    std::thread::spawn(move || {
        pin_current_thread(cpu).unwrap();
        assert_eq!(current_thread_affinity().unwrap(), vec![cpu]);
    })
    .join()
    .unwrap();
}

proptest::proptest! {
    #[test]
    fn allocations_that_fit_use_distinct_physical_cores(
        sockets in 1u32..4, cores in 1u32..12, smt in 1u32..3, osds in 1u32..5, reactors in 1u32..5, policy in 0u8..3,
    ) {
        let t = CpuTopology::synthetic(sockets, cores, smt);
        let policy = [CpuPolicy::Default, CpuPolicy::Osd, CpuPolicy::Socket][policy as usize];
        if let Ok(a) = allocate(&t, policy, None, osds, reactors, false) {
            assert_valid(&t, &a, osds, reactors);
            proptest::prop_assert!(!a.oversubscribed);
        } else {
            // Refusals only happen when the request cannot fit on physical cores.
            proptest::prop_assert!(osds * reactors > sockets * cores || policy != CpuPolicy::Default);
        }
    }
}
