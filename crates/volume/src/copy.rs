//! Copying a volume into a new one, in the same pool or another. A pool of one copy cannot
//! be given copies in place (its objects carry no versions and no PG log), so this is how its
//! volumes move to a pool of copies; until snapshots share extents it is also the full clone.

use crate::{data_oid, Image, VolumeError, Volumes};
use carmine_proto::Status;
use futures::stream::{self, StreamExt, TryStreamExt};

/// What a copy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    /// Data objects written to the new volume.
    pub objects: u64,
    pub bytes: u64,
    /// Objects never written, or written with zeros only: left as holes in the new volume.
    pub holes: u64,
}

impl Volumes {
    /// Copies volume `name` into a new volume `to_name` of `to` (the same pool or another),
    /// of the same size and object size, `depth` objects at a time; `done(bytes)` after each
    /// object. The source is held under its exclusive lock throughout, so no client writes
    /// it meanwhile and the copy is of one moment (a volume in use is refused with who holds
    /// it: stop its clients first). Only the data objects that exist are read, and those that
    /// hold only zeros are not written: holes stay holes. The new volume is marked an
    /// incomplete copy until the last object is in, and refused by every open meanwhile; if
    /// the copy fails it is removed, and if the copier stops half way (killed, or this future
    /// dropped) it stays, refused, until `remove`d.
    pub async fn copy_to(
        &self,
        name: &str,
        to: &Volumes,
        to_name: &str,
        depth: usize,
        done: impl Fn(u64),
    ) -> Result<Copied, VolumeError> {
        let source = self.open(name).await?;
        let res = self.copy_open(&source, to, to_name, depth, done).await;
        let closed = source.close().await;
        let copied = res?;
        closed?;
        Ok(copied)
    }

    async fn copy_open(
        &self,
        source: &Image,
        to: &Volumes,
        to_name: &str,
        depth: usize,
        done: impl Fn(u64),
    ) -> Result<Copied, VolumeError> {
        let info = source.info().clone();
        // Marked incomplete until every object is in: a copier stopped half way (killed, or
        // its future dropped) leaves a volume nobody opens by mistake.
        let created = to
            .create_with(
                to_name,
                info.size,
                Some(info.object_size),
                crate::FEATURE_INCOMPLETE,
            )
            .await?;
        let target = match to
            .open_locked(to_name, &crate::LockOptions::default(), true)
            .await
        {
            Ok(t) => t,
            Err(e) => {
                to.discard_copy(to_name, &created.id).await;
                return Err(e);
            }
        };
        let objects = info.size.div_ceil(info.object_size);
        let res = stream::iter(0..objects)
            .map(|objno| {
                let (source, target, id) = (source.clone(), target.clone(), &info.id);
                async move {
                    let off = objno * info.object_size;
                    let len = info.object_size.min(info.size - off);
                    match self.client.stat(self.pool, &data_oid(id, objno)).await {
                        Ok(_) => {}
                        Err(e) if e.status() == Some(Status::ObjectNotFound) => {
                            return Ok::<_, VolumeError>((false, len));
                        }
                        Err(e) => return Err(e.into()),
                    }
                    let data = source.read(off, len).await?;
                    if data.iter().all(|b| *b == 0) {
                        return Ok((false, len));
                    }
                    target.write(off, data).await?;
                    Ok((true, len))
                }
            })
            .buffer_unordered(depth.max(1))
            .try_fold(Copied::default(), |mut c, (written, len)| {
                if written {
                    c.objects += 1;
                    c.bytes += len;
                } else {
                    c.holes += 1;
                }
                done(len);
                async move { Ok(c) }
            })
            .await;
        let res = match res {
            Ok(c) => target.flush().await.map(|()| c),
            Err(e) => Err(e),
        };
        let closed = target.close().await;
        let finished = match (&res, &closed) {
            (Ok(_), Ok(())) => to.finish_copy(to_name, &created.id).await,
            _ => Ok(()),
        };
        match (res, closed.and(finished)) {
            (Ok(c), Ok(())) => Ok(c),
            (Err(e), _) | (Ok(_), Err(e)) => {
                to.discard_copy(to_name, &created.id).await;
                Err(e)
            }
        }
    }

    /// Removes the copy this process created as image `id`, only if `name` still names it.
    async fn discard_copy(&self, name: &str, id: &str) {
        if let Err(e) = self.begin_remove(name, id).await {
            tracing::warn!(
                "the copy failed, and its partial destination {name} (image {id}) was not \
                 removed: {e}. If {name} is still that image, remove it with `carmine volume rm`"
            );
            return;
        }
        if let Err(e) = self.purge(id).await {
            tracing::warn!(
                "the copy failed; its partial destination {name} (image {id}) is unlisted but \
                 its objects remain ({e}): the next `carmine volume rm` in the pool removes them"
            );
        }
    }
}
