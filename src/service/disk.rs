//! A full disk under the state dir: space kept in reserve, given up when the disk fills
//! so that what runs can still be recorded, and made again when space returns.
//! docs/operations.md#a-full-disk is the operator's side.

use std::io::Write;
use std::path::Path;

use crate::limits::DISK_RESERVE_BYTES;

/// Makes the reserve file (`DISK_RESERVE_BYTES` of zeros, synced) unless it is whole.
/// Fails, leaving no partial reserve, when the disk has no room for it.
pub fn make_reserve(path: &Path) -> std::io::Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == DISK_RESERVE_BYTES) {
        return Ok(());
    }
    let result = (|| {
        let mut file = std::fs::File::create(path)?;
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0;
        while written < DISK_RESERVE_BYTES {
            file.write_all(&chunk)?;
            written += chunk.len() as u64;
        }
        file.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// Gives the reserve back to the filesystem. `true` if there was one.
pub fn release_reserve(path: &Path) -> bool {
    std::fs::remove_file(path).is_ok()
}

/// Whether the filesystem of `path` has room again: the reserve and as much again for the
/// store to grow.
pub fn has_room(path: &Path) -> bool {
    let dir = path.parent().unwrap_or(path);
    match rustix::fs::statvfs(dir) {
        Ok(stat) => stat.f_bavail.saturating_mul(stat.f_frsize) >= 3 * DISK_RESERVE_BYTES,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_made_whole_and_released() {
        let dir = std::env::temp_dir().join(format!("scarab-reserve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("reserve");
        make_reserve(&path).expect("made");
        assert_eq!(
            std::fs::metadata(&path).expect("exists").len(),
            DISK_RESERVE_BYTES
        );
        std::fs::write(&path, b"short").expect("write");
        make_reserve(&path).expect("made again");
        assert_eq!(
            std::fs::metadata(&path).expect("exists").len(),
            DISK_RESERVE_BYTES
        );
        assert!(release_reserve(&path));
        assert!(!release_reserve(&path));
        assert!(has_room(&path));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
