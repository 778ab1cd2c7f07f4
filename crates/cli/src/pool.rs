//! `carmine pool create|ls`: pools beside the one `cluster up` makes, each with its own
//! number of copies, `min_size` and PG count. A new pool is a new map epoch; the OSDs serve
//! (and, with more than one copy, peer) its PGs as soon as they see it.

use anyhow::{Context, Result};
use carmine_cluster::{OsdMap, Pool, PG_NUM_MAX, REPLICA_SIZE_MAX};
use carmine_localcluster::DirArg;
use carmine_mapstore::{Change, MapStoreError, PgHistoryStore};
use carmine_pg::{History, Interval};
use carmine_types::PgId;
use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// Add a pool. Its PGs are placed on the OSDs that are in, each copy on another host
    /// while there are enough hosts.
    Create(CreateArgs),
    /// List the pools: id, name, copies, min_size, PGs.
    Ls {
        #[command(flatten)]
        dir: DirArg,
    },
    /// Change a pool's number of copies (a new copy is filled as a backfill target while
    /// the copies it has serve) or its `min_size`. A pool of one copy can be given copies
    /// (while every OSD holding one of its PGs is up), not the reverse.
    Set(SetArgs),
    /// Remove a pool and every object in it, for good: its volumes go with it. Refused while
    /// one of its volumes is locked by a user. The OSDs delete its PGs' objects in the
    /// background; its id is never given to another pool.
    Rm(RmArgs),
}

#[derive(Args, Debug)]
pub struct RmArgs {
    pub name: String,
    /// Required: the pool's volumes and objects cannot be brought back.
    #[arg(long)]
    pub yes_i_really_mean_it: bool,
    /// Remove it even if the cluster cannot say whether its volumes are in use (it is
    /// down, or the pool's PGs do not answer).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub dir: DirArg,
}

#[derive(Args, Debug)]
pub struct SetArgs {
    pub name: String,
    /// Copies of every object (2 or more).
    #[arg(long)]
    pub size: Option<u8>,
    /// Copies that must be up for a PG to take requests [kept; size - size/2 if the new
    /// size is below it].
    #[arg(long)]
    pub min_size: Option<u8>,
    #[command(flatten)]
    pub dir: DirArg,
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    pub name: String,
    /// Copies of every object [3 with 3 OSDs or more, else 1].
    #[arg(long)]
    pub size: Option<u8>,
    /// Copies that must be up for a PG to take requests [size - size/2].
    #[arg(long)]
    pub min_size: Option<u8>,
    /// Placement groups [64].
    #[arg(long, default_value_t = 64)]
    pub pg_num: u32,
    #[command(flatten)]
    pub dir: DirArg,
}

pub fn run(cmd: PoolCommand) -> Result<()> {
    match cmd {
        PoolCommand::Create(a) => create(&a),
        PoolCommand::Set(a) => set(&a),
        PoolCommand::Rm(a) => rm(&a),
        PoolCommand::Ls { dir } => {
            let map = carmine_localcluster::read_map(&dir.dir)?;
            print!("{}", list(&map));
            Ok(())
        }
    }
}

fn list(map: &OsdMap) -> String {
    let mut s = format!(
        "{:>4}  {:<16} {:>5} {:>8} {:>6}\n",
        "id", "name", "size", "min_size", "pgs"
    );
    for p in &map.pools {
        s.push_str(&format!(
            "{:>4}  {:<16} {:>5} {:>8} {:>6}\n",
            p.id, p.name, p.size, p.min_size, p.pg_num
        ));
    }
    s
}

/// The next map with pool `a` added, or why it cannot be.
fn with_pool(map: &OsdMap, a: &CreateArgs) -> Result<OsdMap, String> {
    if a.name.is_empty() || a.name.len() > 64 || a.name.chars().any(|c| c.is_control()) {
        return Err(format!(
            "{:?}: a pool name is 1 to 64 printable characters",
            a.name
        ));
    }
    if map.pools.iter().any(|p| p.name == a.name) {
        return Err(format!("pool {:?} exists already", a.name));
    }
    let size = a.size.unwrap_or(if map.osds.len() >= 3 { 3 } else { 1 });
    if size == 0 || size > REPLICA_SIZE_MAX {
        return Err(format!(
            "--size {size}: a pool keeps 1 to {REPLICA_SIZE_MAX} copies"
        ));
    }
    if usize::from(size) > map.osds.len() {
        return Err(format!(
            "--size {size} needs at least {size} OSDs (the map has {})",
            map.osds.len()
        ));
    }
    let min_size = a.min_size.unwrap_or(size - size / 2);
    if min_size == 0 || min_size > size {
        return Err(format!(
            "--min-size {min_size}: between 1 and the pool's size ({size})"
        ));
    }
    if a.pg_num == 0 || a.pg_num > PG_NUM_MAX {
        return Err(format!("--pg-num {}: 1 to {PG_NUM_MAX}", a.pg_num));
    }
    // Never an id given before: a removed pool's objects may still be on an OSD that was
    // down when it went.
    let id = map.highest_pool_id() + 1;
    if id == u32::MAX {
        return Err("no pool id is left".into());
    }
    let mut next = map.clone();
    next.epoch = map.epoch + 1;
    next.pools.push(Pool {
        id,
        name: a.name.clone(),
        pg_num: a.pg_num,
        size,
        min_size,
    });
    next.pool_max = id;
    next.validate().map_err(|e| e.to_string())?;
    Ok(next)
}

/// The next map without pool `name` (nor its placement exceptions and temporary sets), or
/// why it cannot be.
fn without_pool(map: &OsdMap, name: &str) -> Result<OsdMap, String> {
    let id = map
        .pool_by_name(name)
        .map_err(|_| format!("no pool {name:?}"))?
        .id;
    if map.pools.len() == 1 {
        return Err(format!(
            "pool {name:?} is the cluster's last pool: `cluster up` checks its settings \
             against the first pool; create another pool first"
        ));
    }
    let mut next = map.clone();
    next.epoch = map.epoch + 1;
    next.pool_max = map.highest_pool_id();
    next.pools.retain(|p| p.id != id);
    next.upmaps.retain(|pg, _| pg.pool != id);
    next.pg_temp.retain(|pg, _| pg.pool != id);
    next.given_copies.remove(&id);
    next.validate().map_err(|e| e.to_string())?;
    Ok(next)
}

/// How long `pool rm` waits for the cluster to list the pool's volumes and their locks.
const LOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// A pool's volumes, and the first of them locked by a user.
struct InPool {
    volumes: Vec<String>,
    /// (volume, holder)
    locked: Option<(String, String)>,
}

/// The volumes of pool `pool`, as the cluster says now.
fn volumes_in(dir: &std::path::Path, pool: &str) -> Result<InPool> {
    carmine_reactor::block_on(async {
        let look = async {
            let client = carmine_localcluster::connect(dir).await?;
            let id = client.pool_id(pool)?;
            let volumes = carmine_volume::Volumes::new(client, id);
            let names = volumes.list().await?;
            for n in &names {
                if let Some(l) = volumes.lock_holder(n).await? {
                    let locked = Some((n.clone(), l.holder));
                    return Ok(InPool {
                        volumes: names.clone(),
                        locked,
                    });
                }
            }
            anyhow::Ok(InPool {
                volumes: names,
                locked: None,
            })
        };
        carmine_reactor::timeout(LOOK_TIMEOUT, look)
            .await
            .map_err(|_| anyhow::anyhow!("no answer in {LOOK_TIMEOUT:?}"))?
    })
}

fn rm(a: &RmArgs) -> Result<()> {
    let map = carmine_localcluster::read_map(&a.dir.dir)?;
    let pool = map
        .pool_by_name(&a.name)
        .map_err(|_| anyhow::anyhow!("no pool {:?}", a.name))?
        .clone();
    if !a.yes_i_really_mean_it {
        anyhow::bail!(
            "removing pool {:?} deletes its {} PGs with every volume and object in them, for \
             good; say --yes-i-really-mean-it to go ahead",
            a.name,
            pool.pg_num
        );
    }
    match volumes_in(&a.dir.dir, &a.name) {
        Ok(InPool {
            locked: Some((volume, holder)),
            ..
        }) => anyhow::bail!(
            "volume {volume:?} of pool {:?} is locked by {holder}: stop its user first (or, \
             if that user is gone, `carmine volume lock break {volume} --pool {}`)",
            a.name,
            a.name
        ),
        Ok(InPool { volumes: names, .. }) if !names.is_empty() => {
            println!(
                "removing {} volume(s) with the pool: {}",
                names.len(),
                names.join(", ")
            )
        }
        Ok(_) => {}
        Err(e) if a.force => {
            eprintln!("warning: could not look at the pool's volumes ({e:#}); removing it anyway")
        }
        Err(e) => anyhow::bail!(
            "could not look whether the volumes of pool {:?} are in use ({e:#}); bring the \
             cluster up, or say --force to remove the pool without looking",
            a.name
        ),
    }
    // A client that takes a volume's lock from now on loses its writes with the pool: the
    // lock is looked at, not held, while the map changes.
    let store = carmine_localcluster::map_store(&a.dir.dir)?;
    let stored = carmine_mapstore::update(store.as_ref(), 10, |current| {
        let map = current.ok_or_else(|| {
            MapStoreError::Invalid("the cluster has no map (is a cluster up there?)".into())
        })?;
        if map.pool(pool.id).is_err() {
            return Err(MapStoreError::Invalid(format!(
                "pool {:?} was removed meanwhile",
                a.name
            )));
        }
        without_pool(map, &a.name)
            .map(Some)
            .map_err(MapStoreError::Invalid)
    })?
    .context("the cluster has no map")?;
    println!(
        "pool {} ({:?}) removed in map epoch {}; the OSDs delete its objects in the background",
        pool.id, pool.name, stored.epoch
    );
    // Its PGs' recorded histories: nothing reads them once the id is gone. A primary that
    // had not yet heard may record one more; it stays as harmless garbage.
    match carmine_localcluster::pg_histories(&a.dir.dir).and_then(|h| Ok(h.remove_pool(pool.id)?)) {
        Ok(n) => println!("{n} recorded PG histories of the pool removed"),
        Err(e) => eprintln!("warning: the pool's PG histories stay in the map store: {e:#}"),
    }
    Ok(())
}

/// The next map with pool `a.name` changed as `a` says, or why it cannot be; `None` if it
/// says what the pool has already. A new copy of a PG is primed as a backfill target of the
/// copies that serve it now (`OsdMap::prime_temps`): they keep serving, every write goes to
/// the new copy too, and once it holds everything the PG moves to its full set.
fn with_pool_changed(map: &OsdMap, a: &SetArgs) -> Result<Option<OsdMap>, String> {
    let pool = map
        .pools
        .iter()
        .find(|p| p.name == a.name)
        .ok_or_else(|| format!("no pool {:?}", a.name))?;
    let size = a.size.unwrap_or(pool.size);
    if pool.size < 2 && size > pool.size {
        first_histories(map, pool)?;
    }
    if size < 2 && size != pool.size {
        return Err(format!(
            "--size {size}: a pool of copies keeps 2 to {REPLICA_SIZE_MAX} (its copies' PG \
             logs would go stale under one copy); for a single copy make a pool with --size 1"
        ));
    }
    if size > REPLICA_SIZE_MAX {
        return Err(format!(
            "--size {size}: a pool keeps 1 to {REPLICA_SIZE_MAX} copies"
        ));
    }
    if usize::from(size) > map.osds.len() {
        return Err(format!(
            "--size {size} needs at least {size} OSDs (the map has {})",
            map.osds.len()
        ));
    }
    let min_size = match a.min_size {
        Some(m) => m,
        None if pool.min_size > size => size - size / 2,
        None => pool.min_size,
    };
    if min_size == 0 || min_size > size {
        return Err(format!(
            "--min-size {min_size}: between 1 and the pool's size ({size})"
        ));
    }
    if (size, min_size) == (pool.size, pool.min_size) {
        return Ok(None);
    }
    let mut next = map.clone();
    next.epoch = map.epoch + 1;
    let p = next
        .pools
        .iter_mut()
        .find(|p| p.name == a.name)
        .expect("found above");
    p.size = size;
    p.min_size = min_size;
    if pool.size < 2 && size > 1 {
        next.given_copies.insert(pool.id, map.epoch);
    }
    next.prime_temps(map);
    // A min_size above the copies that serve a PG while another fills would end its
    // temporary set (the map follows a set only while it has min_size OSDs up), making the
    // copy being filled act before it holds the data: every write then waits for it to
    // recover the object first. Refused until the fill is over.
    if min_size > pool.min_size {
        let filling: Vec<String> = pool
            .pgs()
            .filter(|pg| {
                let serving = map.pg_osds(*pg, pool.size);
                next.pg_osds(*pg, size).iter().any(|o| !serving.contains(o))
            })
            .map(|pg| pg.to_string())
            .collect();
        if !filling.is_empty() {
            return Err(format!(
                "--min-size {min_size}: {} PGs of pool {:?} (first {}) are served by fewer \
                 copies while a new copy is filled, and would have to take the copy being \
                 filled into their acting set; raise min_size once `carmine cluster status` \
                 shows no PG filling",
                filling.len(),
                a.name,
                filling[0]
            ));
        }
    }
    next.validate().map_err(|e| e.to_string())?;
    Ok(Some(next))
}

/// The history each PG of one-copy pool `pool` starts from when it is given copies: one
/// interval, of `map` (its last epoch of one copy), whose only member is the OSD holding the
/// PG. That OSD, finding itself so named with no versioned state, takes the objects it holds
/// into the PG's state (`carmine_osd`'s adoption); and no primary of a later interval goes
/// active without hearing from it (or `osd lost`), so a copy still being filled never serves
/// in its place. Refused while a PG's holder is down: its PG would peer without its data.
fn first_histories(map: &OsdMap, pool: &Pool) -> Result<Vec<(PgId, Interval)>, String> {
    let mut out = Vec::with_capacity(pool.pg_num as usize);
    let mut down = Vec::new();
    for pg in pool.pgs() {
        match map.pg_osds(pg, 1).first() {
            Some(holder) if map.osd(*holder).is_some_and(|o| o.up) => out.push((
                pg,
                Interval {
                    epoch: map.epoch,
                    acting: vec![*holder],
                },
            )),
            _ => down.push(pg),
        }
    }
    if let Some(first) = down.first() {
        return Err(format!(
            "pool {:?} keeps one copy, and the OSDs holding {} of its PGs (first {first}) are \
             down: their copies could not be taken in. Start them (or, if their disks are \
             gone, `carmine osd lost`) and ask again",
            pool.name,
            down.len()
        ));
    }
    Ok(out)
}

/// Records `histories` (see [`first_histories`]), replacing whatever a former attempt left;
/// refused if a PG's history has an interval newer than `epoch`: the pool has been given
/// copies already, and a primary records there now.
fn record_first_histories(
    store: &dyn PgHistoryStore,
    epoch: u32,
    histories: Vec<(PgId, Interval)>,
) -> Result<(), MapStoreError> {
    for (pg, interval) in histories {
        let first = vec![interval];
        let edit = &mut |now: &History| {
            if let Some(i) = now.intervals.iter().find(|i| i.epoch > epoch) {
                return Err(MapStoreError::Invalid(format!(
                    "PG {pg} has a history recorded in epoch {}, after this map's {epoch}: \
                     the pool has copies already; ask again",
                    i.epoch
                )));
            }
            Ok((now.intervals != first).then(|| History {
                intervals: first.clone(),
            }))
        };
        if let Change::Kept(now) = store.change(pg, edit)? {
            if now.intervals != first {
                return Err(MapStoreError::Invalid(format!(
                    "PG {pg}'s history changed while it was being recorded; ask again"
                )));
            }
        }
    }
    Ok(())
}

fn set(a: &SetArgs) -> Result<()> {
    let store = carmine_localcluster::map_store(&a.dir.dir)?;
    let mut histories: Option<Box<dyn PgHistoryStore>> = None;
    let mut unchanged = None;
    let stored = carmine_mapstore::update(store.as_ref(), 10, |current| {
        let map = current.ok_or_else(|| {
            MapStoreError::Invalid("the cluster has no map (is a cluster up there?)".into())
        })?;
        match with_pool_changed(map, a).map_err(MapStoreError::Invalid)? {
            Some(next) => {
                // Copies for a pool of one: its PGs' first histories go before the map that
                // makes them replicated, so no OSD peers one without them.
                let before = map.pools.iter().find(|p| p.name == a.name);
                if let Some(pool) = before.filter(|p| p.size < 2 && a.size > Some(p.size)) {
                    let first = first_histories(map, pool).map_err(MapStoreError::Invalid)?;
                    if histories.is_none() {
                        histories = Some(
                            carmine_localcluster::pg_histories(&a.dir.dir)
                                .map_err(|e| MapStoreError::Invalid(format!("{e:#}")))?,
                        );
                    }
                    let h = histories.as_deref().expect("opened above");
                    record_first_histories(h, map.epoch, first)?;
                }
                Ok(Some(next))
            }
            None => {
                unchanged = Some(map.epoch);
                Ok(None)
            }
        }
    })?;
    let map = match (stored, unchanged) {
        (_, Some(epoch)) => {
            println!("pool {:?} is as asked already; map epoch {epoch}", a.name);
            return Ok(());
        }
        (Some(map), None) => map,
        (None, None) => anyhow::bail!("the cluster has no map"),
    };
    let pool = map
        .pools
        .iter()
        .find(|p| p.name == a.name)
        .context("the stored map lacks the pool")?;
    let filling = pool
        .pgs()
        .filter(|pg| !map.pg_backfill_targets(*pg, pool.size).is_empty())
        .count();
    let below = pool
        .pgs()
        .filter(|pg| map.pg_osds(*pg, pool.size).len() < usize::from(pool.min_size))
        .count();
    // Fewer copies: the copies dropped go once the PG is clean on the rest (strays).
    let fill = if filling > 0 {
        format!(
            "; {filling} PGs fill a new copy while their current copies serve (`carmine \
             cluster status` shows the progress)"
        )
    } else {
        String::new()
    };
    println!(
        "pool {} ({:?}): {} copies, min_size {}; map epoch {}{fill}",
        pool.id, pool.name, pool.size, pool.min_size, map.epoch
    );
    if below > 0 {
        eprintln!(
            "warning: {below} PGs have fewer than {} copies up, and take no writes until \
             they have",
            pool.min_size
        );
    }
    Ok(())
}

fn create(a: &CreateArgs) -> Result<()> {
    let store = carmine_localcluster::map_store(&a.dir.dir)?;
    let stored = carmine_mapstore::update(store.as_ref(), 10, |current| {
        let map = current.ok_or_else(|| {
            MapStoreError::Invalid("the cluster has no map (is a cluster up there?)".into())
        })?;
        with_pool(map, a).map(Some).map_err(MapStoreError::Invalid)
    })?
    .context("the cluster has no map")?;
    let pool = stored
        .pools
        .iter()
        .find(|p| p.name == a.name)
        .context("the stored map lacks the new pool")?;
    let hosts: std::collections::BTreeSet<&str> =
        stored.osds.iter().map(|o| o.host.as_str()).collect();
    if usize::from(pool.size) > hosts.len() {
        eprintln!(
            "note: {} copies on {} host(s): some copies of a PG share a host, and a host's \
             failure can take more than one",
            pool.size,
            hosts.len()
        );
    }
    println!(
        "pool {} ({:?}): {} cop{}, min_size {}, {} PGs; map epoch {}",
        pool.id,
        pool.name,
        pool.size,
        if pool.size == 1 { "y" } else { "ies" },
        pool.min_size,
        pool.pg_num,
        stored.epoch
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use carmine_cluster::OsdInfo;
    use carmine_types::PgId;

    fn map(hosts: &[&str]) -> OsdMap {
        let mut m = OsdMap::single_osd(vec!["127.0.0.1:6800".parse().unwrap()], 8);
        m.osds = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                OsdInfo::new(
                    i as u32,
                    h,
                    vec![format!("127.0.0.1:{}", 6900 + i).parse().unwrap()],
                )
            })
            .collect();
        m
    }

    fn args(name: &str, size: Option<u8>, min_size: Option<u8>, pg_num: u32) -> CreateArgs {
        CreateArgs {
            name: name.into(),
            size,
            min_size,
            pg_num,
            dir: DirArg {
                dir: "unused".into(),
            },
        }
    }

    #[test]
    fn a_pool_gets_the_next_id_and_epoch_with_the_defaults_of_its_cluster() {
        let m = map(&["a", "b", "c"]);
        let next = with_pool(&m, &args("rep", None, None, 32)).unwrap();
        assert_eq!(next.epoch, m.epoch + 1);
        let p = next.pools.last().unwrap();
        assert_eq!((p.id, p.size, p.min_size, p.pg_num), (2, 3, 2, 32));
        assert_eq!(next.pools.len(), m.pools.len() + 1);
        assert!(list(&next).contains("rep"));
    }

    #[test]
    fn bad_pools_are_refused_with_the_reason() {
        let m = map(&["a", "b", "a"]);
        let refused = |a: CreateArgs, why: &str| {
            let e = with_pool(&m, &a).unwrap_err();
            assert!(e.contains(why), "{e}");
        };
        refused(args("rbd", Some(1), None, 8), "exists already");
        refused(args("r", Some(4), None, 8), "at least 4 OSDs");
        refused(args("r", Some(2), Some(3), 8), "--min-size 3");
        refused(args("r", Some(0), None, 8), "1 to");
        refused(args("r", Some(2), None, 0), "--pg-num 0");
        refused(args("r", Some(2), None, PG_NUM_MAX + 1), "--pg-num");
        refused(args("", Some(2), None, 8), "pool name");
        // Copies share a host only when there are too few hosts (placement's rule).
        assert!(with_pool(&m, &args("r", Some(3), None, 8)).is_ok());
    }

    #[test]
    fn a_removed_pool_takes_its_exceptions_and_sets_along_and_its_id_is_never_given_again() {
        let m = map(&["a", "b", "c", "d"]);
        let m = with_pool(&m, &args("rep", Some(3), Some(2), 8)).unwrap();
        let mut m = with_pool(&m, &args("last", Some(2), None, 8)).unwrap();
        let (rep, last) = (PgId { pool: 2, seed: 0 }, PgId { pool: 3, seed: 1 });
        for pg in [rep, last] {
            let placed = m.pg_placement(pg, 2);
            let spare = (0..4).find(|id| !placed.contains(id)).unwrap();
            m.upmaps.insert(pg, vec![(placed[0], spare)]);
            m.pg_temp.insert(pg, placed.clone());
        }
        m.validate().unwrap();
        // The pool with the highest id goes: its id stays taken.
        let next = without_pool(&m, "last").unwrap();
        assert_eq!(next.epoch, m.epoch + 1);
        assert_eq!(next.pools.len(), 2);
        assert_eq!(next.upmaps.keys().collect::<Vec<_>>(), vec![&rep]);
        assert_eq!(next.pg_temp.keys().collect::<Vec<_>>(), vec![&rep]);
        assert!(next.pool_removed(3) && !next.pool_removed(2));
        let round = OsdMap::decode(next.encode()).unwrap();
        assert_eq!(round, next);
        let again = with_pool(&round, &args("last", Some(2), None, 8)).unwrap();
        assert_eq!(
            again.pools.last().unwrap().id,
            4,
            "id 3 is never given again"
        );
        assert!(again.pool_removed(3));
        // The first pool too; an unknown name is refused.
        let fewer = without_pool(&again, "rbd").unwrap();
        assert!(fewer.pool_removed(1) && fewer.any_pool_removed());
        let e = without_pool(&fewer, "rbd").unwrap_err();
        assert!(e.contains("no pool"), "{e}");
        // The last pool stays: `cluster up` checks its flags against the first one.
        let one = without_pool(&fewer, "rep").unwrap();
        let e = without_pool(&one, "last").unwrap_err();
        assert!(e.contains("last pool"), "{e}");
    }

    fn set_args(name: &str, size: Option<u8>, min_size: Option<u8>) -> SetArgs {
        SetArgs {
            name: name.into(),
            size,
            min_size,
            dir: DirArg {
                dir: "unused".into(),
            },
        }
    }

    #[test]
    fn a_pool_given_a_copy_more_keeps_serving_from_its_copies_while_the_new_ones_fill() {
        let m = map(&["a", "b", "c", "d"]);
        let m = with_pool(&m, &args("rep", Some(2), Some(1), 16)).unwrap();
        let next = with_pool_changed(&m, &set_args("rep", Some(3), None))
            .unwrap()
            .unwrap();
        assert_eq!(next.epoch, m.epoch + 1);
        let p = next.pools.iter().find(|p| p.name == "rep").unwrap();
        assert_eq!((p.size, p.min_size), (3, 1), "min_size kept");
        for seed in 0..16 {
            let pg = carmine_types::PgId { pool: p.id, seed };
            let before = m.pg_osds(pg, 2);
            // The copies there serve; the one placement adds fills as a backfill target.
            assert_eq!(next.pg_osds(pg, 3), before, "pg {pg}");
            let targets = next.pg_backfill_targets(pg, 3);
            assert_eq!(targets.len(), 1, "pg {pg}");
            assert!(!before.contains(&targets[0]));
            assert!(next.pg_placement(pg, 3).contains(&targets[0]));
        }
        // min_size 3 now would make the copies being filled act before they are full.
        let e = with_pool_changed(&next, &set_args("rep", None, Some(3))).unwrap_err();
        assert!(e.contains("are served by fewer copies"), "{e}");
        let e = with_pool_changed(&m, &set_args("rep", Some(3), Some(3))).unwrap_err();
        assert!(e.contains("are served by fewer copies"), "{e}");
        // And back to two: no set, the PGs act on their placement of two again.
        let back = with_pool_changed(&next, &set_args("rep", Some(2), None))
            .unwrap()
            .unwrap();
        assert!(back.pg_temp.is_empty(), "{:?}", back.pg_temp);
        // Asking for what it has changes nothing.
        assert!(with_pool_changed(&back, &set_args("rep", Some(2), Some(1)))
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_pool_given_fewer_copies_while_one_fills_keeps_serving_from_complete_ones() {
        let m = map(&["a", "b", "c", "d"]);
        let mut m = with_pool(&m, &args("rep", Some(3), Some(2), 8)).unwrap();
        let pg = carmine_types::PgId { pool: 2, seed: 0 };
        let placed = m.pg_placement(pg, 3);
        let spare = (0..4).find(|id| !placed.contains(id)).unwrap();
        // placed[0] is being filled; the spare OSD, complete, serves in its stead.
        m.pg_temp.insert(pg, vec![spare, placed[1], placed[2]]);
        let next = with_pool_changed(&m, &set_args("rep", Some(2), None))
            .unwrap()
            .unwrap();
        assert_eq!(next.pg_placement(pg, 2), placed[..2].to_vec());
        assert_eq!(next.pg_osds(pg, 2), vec![spare, placed[1]]);
        assert_eq!(next.pg_backfill_targets(pg, 2), vec![placed[0]]);
    }

    #[test]
    fn a_pool_of_one_copy_is_given_copies_from_its_holders_only_while_they_are_up() {
        let mut m = map(&["a", "b", "c"]);
        for o in &mut m.osds {
            o.up = true;
        }
        let pool = m.pool(1).unwrap().clone();
        assert_eq!(pool.size, 1);
        let first = first_histories(&m, &pool).unwrap();
        assert_eq!(first.len(), pool.pg_num as usize);
        for (pg, interval) in &first {
            assert_eq!(interval.epoch, m.epoch, "the last epoch of one copy");
            assert_eq!(
                interval.acting,
                m.pg_placement(*pg, 1),
                "{pg}: its holder alone"
            );
        }
        let next = with_pool_changed(&m, &set_args("rbd", Some(3), None))
            .unwrap()
            .unwrap();
        let p = next.pool(1).unwrap();
        assert_eq!(
            (p.size, p.min_size),
            (3, 1),
            "min_size kept while they fill"
        );
        assert_eq!(
            next.given_copies.get(&1),
            Some(&m.epoch),
            "the last epoch of one copy"
        );
        for (pg, interval) in &first {
            // The holder serves; the two new copies fill as backfill targets.
            assert_eq!(next.pg_osds(*pg, 3), interval.acting, "{pg}");
            let targets = next.pg_backfill_targets(*pg, 3);
            assert_eq!(targets.len(), 2, "{pg}");
            assert!(!targets.contains(&interval.acting[0]));
        }
        // A holder down: its PGs would peer without their data.
        let (down_pg, down) = (first[0].0, first[0].1.acting[0]);
        m.osds[down as usize].up = false;
        let e = with_pool_changed(&m, &set_args("rbd", Some(3), None)).unwrap_err();
        assert!(e.contains("are down"), "{e}");
        assert!(first_histories(&m, &pool).is_err(), "{down_pg}");
    }

    #[test]
    fn size_and_min_size_changes_are_checked() {
        let m = map(&["a", "b", "c"]);
        let m = with_pool(&m, &args("rep", Some(3), None, 8)).unwrap();
        let refused = |a: SetArgs, why: &str| {
            let e = with_pool_changed(&m, &a).unwrap_err();
            assert!(e.contains(why), "{e}");
        };
        refused(set_args("nope", Some(2), None), "no pool \"nope\"");
        refused(set_args("rep", Some(1), None), "2 to");
        refused(set_args("rep", Some(4), None), "at least 4 OSDs");
        refused(set_args("rep", None, Some(4)), "--min-size 4");
        refused(set_args("rep", None, Some(0)), "--min-size 0");
        // A min_size above the new size comes down to that size's default.
        let two = with_pool_changed(&m, &set_args("rep", Some(2), None))
            .unwrap()
            .unwrap();
        let p = two.pools.iter().find(|p| p.name == "rep").unwrap();
        assert_eq!((p.size, p.min_size), (2, 2));
        let one = with_pool_changed(&m, &set_args("rep", None, Some(1)))
            .unwrap()
            .unwrap();
        let p = one.pools.iter().find(|p| p.name == "rep").unwrap();
        assert_eq!((p.size, p.min_size), (3, 1));
    }
}
