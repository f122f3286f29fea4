//! The parity gate's float32 reference outputs, kept on disk between starts.
//!
//! Every int8 or bf16 start (and every f16/bf16 GPU start, which loads a float32 copy on the CPU
//! for it) runs the gate's rows through the checkpoint's float32 forward first: 7.5 s of a 13.8-s
//! int8 start of the full-size ModernBERT-large on two Zen 4 cores (docs/benchmarks/notes.md, stop
//! 55). Those outputs are a function of the code, the weights, the rows and the kernels alone, so a
//! worker started again on the same files (a restart after a crash, a reload, the next boot) reads
//! them back instead. Only the reference is kept: the reduced-precision rows still run, and the
//! gate still judges them, at every start.
//!
//! An entry is named by the SHA-256 of everything its outputs depend on: this executable's own
//! bytes (the model code and its kernels), the weights' SHA-256, the CPU kernel family and thread
//! count the reference runs with, and every gate row (question type, token ids, markers) with its
//! batch. A rebuilt worker, another checkpoint, tokenizer or gate request is another name. An entry
//! that does not read back as exactly what its rows need (a row's number of logits, no bytes left
//! over) is ignored and computed again. Writes are best effort — a read-only home or a full disk
//! costs the time, nothing else — and atomic: written whole beside the entry, in a file no other
//! writer shares (workers of several hosts may share the directory), then renamed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use layad_cpu_kernels::CpuKernels;
use layad_proto::{Row, RowOutput};

/// First bytes of an entry, with the version of its layout.
const MAGIC: &[u8; 8] = b"LAYADGR1";

/// A directory of reference entries.
#[derive(Clone, Debug)]
pub struct ReferenceCache {
    dir: PathBuf,
}

/// What a float32 reference ran with, besides the rows: the weights and the kernels.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReferenceSetup<'a> {
    /// Lower-case hex SHA-256 of `model.safetensors`.
    pub(crate) weights_sha256: &'a str,
    /// The CPU kernel family the float32 model was packed for.
    pub(crate) kernels: CpuKernels,
    /// Threads of the pool it runs on.
    pub(crate) threads: usize,
}

impl ReferenceCache {
    /// Entries under `dir` (created on the first write).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The entry name of `batches` run with `setup`; `None` when this executable cannot be read
    /// (then nothing is kept: the code that made an entry could not be told apart).
    pub(crate) fn key(setup: ReferenceSetup<'_>, batches: &[Vec<Row>]) -> Option<String> {
        let executable = executable_sha256()?;
        let mut material = Vec::new();
        for part in [
            MAGIC.as_slice(),
            executable.as_bytes(),
            setup.weights_sha256.as_bytes(),
            setup.kernels.as_str().as_bytes(),
        ] {
            material.extend_from_slice(&(part.len() as u64).to_le_bytes());
            material.extend_from_slice(part);
        }
        material.extend_from_slice(&(setup.threads as u64).to_le_bytes());
        for batch in batches {
            material.extend_from_slice(&(batch.len() as u64).to_le_bytes());
            for row in batch {
                material.extend_from_slice(&row.qtype.index().to_le_bytes());
                for list in [&row.ids, &row.markers] {
                    material.extend_from_slice(&(list.len() as u64).to_le_bytes());
                    material.extend(list.iter().flat_map(|v| v.to_le_bytes()));
                }
            }
        }
        Some(laya::checkpoint::sha256_hex(&material))
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.ref"))
    }

    /// The outputs kept for `key`, one per row of `batches` in order, when an entry reads back as
    /// exactly that; `None` otherwise (no entry, or one that does not fit: computed again).
    pub(crate) fn load(&self, key: &str, batches: &[Vec<Row>]) -> Option<Vec<RowOutput>> {
        let bytes = std::fs::read(self.path(key)).ok()?;
        let outputs = decode(&bytes, batches);
        if outputs.is_none() {
            tracing::warn!(entry = %self.path(key).display(), "gate reference entry unreadable; computing it again");
        }
        outputs
    }

    /// Keeps `outputs` as `key`'s entry: written to a file of its own, then renamed into place, so
    /// a reader sees the whole entry or none. The file is created exclusively, under a name with
    /// the time and a count of this process's writes: workers of several hosts or containers
    /// sharing the directory can have the same process id, and two writers of one file could leave
    /// a hole of zeros in what is renamed.
    pub(crate) fn store(&self, key: &str, outputs: &[RowOutput]) -> std::io::Result<()> {
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        std::fs::create_dir_all(&self.dir)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let write = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let staging = self
            .dir
            .join(format!(".{key}.{}-{nanos}-{write}.tmp", std::process::id()));
        // Created here or not at all: only a file this call created is its to remove below.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&staging)?;
        let written = file
            .write_all(&encode(outputs))
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&staging, self.path(key)));
        if written.is_err() {
            // What is left of a failed write is nobody's: it would only take space.
            let _ = std::fs::remove_file(&staging);
        }
        written
    }

    /// Where the entries are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// SHA-256 of this process's executable, read once.
fn executable_sha256() -> Option<&'static str> {
    static HASH: OnceLock<Option<String>> = OnceLock::new();
    HASH.get_or_init(|| {
        let hashed = std::env::current_exe()
            .and_then(std::fs::read)
            .map(|bytes| laya::checkpoint::sha256_hex(&bytes));
        hashed
            .inspect_err(
                |error| tracing::warn!(%error, "this executable is unreadable: the gate's reference is not kept"),
            )
            .ok()
    })
    .as_deref()
}

/// `MAGIC`, the number of rows, then per row its logits and its act probabilities, each a count
/// and that many float32s; little-endian throughout.
fn encode(outputs: &[RowOutput]) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    // A count past u32 (never: the gate has 8 rows) writes an entry that reads back as none.
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    bytes.extend_from_slice(&count(outputs.len()));
    for output in outputs {
        for values in [&output.logits, &output.act_probabilities] {
            bytes.extend_from_slice(&count(values.len()));
            bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        }
    }
    bytes
}

/// The inverse of [`encode`], for the rows of `batches`: `None` unless there is one output per row,
/// each with one logit per marker, and no byte left over.
fn decode(bytes: &[u8], batches: &[Vec<Row>]) -> Option<Vec<RowOutput>> {
    let mut rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let rows: Vec<&Row> = batches.iter().flatten().collect();
    if read_count(&mut rest)? != rows.len() {
        return None;
    }
    let mut outputs = Vec::with_capacity(rows.len());
    for row in rows {
        let logits = read_values(&mut rest)?;
        if logits.len() != row.markers.len() {
            return None;
        }
        let act_probabilities = read_values(&mut rest)?;
        outputs.push(RowOutput {
            logits,
            act_probabilities,
        });
    }
    rest.is_empty().then_some(outputs)
}

/// A little-endian u32 count off the front of `rest`.
fn read_count(rest: &mut &[u8]) -> Option<usize> {
    let (head, tail) = rest.split_first_chunk::<4>()?;
    *rest = tail;
    usize::try_from(u32::from_le_bytes(*head)).ok()
}

/// A count and that many little-endian float32s off the front of `rest`.
fn read_values(rest: &mut &[u8]) -> Option<Vec<f32>> {
    let n = read_count(rest)?;
    let (values, tail) = rest.split_at_checked(n.checked_mul(4)?)?;
    *rest = tail;
    Some(
        values
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use laya::question::QuestionType;

    use super::*;

    fn row(ids: &[u32], markers: &[u32], qtype: QuestionType) -> Row {
        Row {
            ids: ids.to_vec(),
            markers: markers.to_vec(),
            qtype,
        }
    }

    fn batches() -> Vec<Vec<Row>> {
        vec![
            vec![row(&[1, 5, 9, 2], &[1, 2], QuestionType::Choice)],
            vec![
                row(&[1, 7, 2], &[1], QuestionType::Noul),
                row(&[1, 8, 8, 8, 2], &[1, 2, 3], QuestionType::Score),
            ],
        ]
    }

    fn outputs() -> Vec<RowOutput> {
        let output = |logits: &[f32]| RowOutput {
            logits: logits.to_vec(),
            act_probabilities: vec![0.25, 0.75, f32::MIN_POSITIVE],
        };
        vec![output(&[0.1, -3.5]), output(&[-0.0]), output(&[1e-30, 7.25, f32::MAX])]
    }

    fn setup(weights_sha256: &str) -> ReferenceSetup<'_> {
        ReferenceSetup {
            weights_sha256,
            kernels: CpuKernels::Avx2,
            threads: 2,
        }
    }

    #[test]
    fn an_entry_reads_back_bit_for_bit_and_only_for_its_rows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = ReferenceCache::new(dir.path().join("gate"));
        let key = ReferenceCache::key(setup("ab12"), &batches()).expect("this test binary is readable");
        assert_eq!(cache.load(&key, &batches()), None, "nothing kept yet");
        cache.store(&key, &outputs()).expect("store");
        let back = cache.load(&key, &batches()).expect("kept");
        let bits = |o: &[RowOutput]| -> Vec<u32> {
            o.iter()
                .flat_map(|r| r.logits.iter().chain(&r.act_probabilities).map(|v| v.to_bits()))
                .collect()
        };
        assert_eq!(bits(&back), bits(&outputs()));
        // Only the entry is left in the directory: the staging file was renamed into place.
        let names: Vec<_> = std::fs::read_dir(cache.dir())
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from(format!("{key}.ref"))]);
        // The same file does not fit rows with another number of markers.
        let mut other = batches();
        other[0][0].markers.pop();
        assert_eq!(cache.load(&key, &other), None);
    }

    #[test]
    fn the_name_changes_with_the_weights_the_kernels_the_threads_and_every_row() {
        let base = ReferenceCache::key(setup("ab12"), &batches()).expect("key");
        assert_eq!(
            ReferenceCache::key(setup("ab12"), &batches()).as_deref(),
            Some(base.as_str())
        );
        let mut changed = vec![
            ReferenceCache::key(setup("ab13"), &batches()),
            ReferenceCache::key(
                ReferenceSetup {
                    kernels: CpuKernels::Avx512,
                    ..setup("ab12")
                },
                &batches(),
            ),
            ReferenceCache::key(
                ReferenceSetup {
                    threads: 3,
                    ..setup("ab12")
                },
                &batches(),
            ),
        ];
        let edits: [fn(&mut Vec<Vec<Row>>); 5] = [
            |b| b[1][1].ids[2] = 9,
            |b| b[1][0].markers[0] = 2,
            |b| b[0][0].qtype = QuestionType::Score,
            // The same rows in other batches pad differently.
            |b| {
                let moved = b[1].remove(0);
                b[0].push(moved);
            },
            |b| b[1][0].ids.push(0),
        ];
        for edit in edits {
            let mut rows = batches();
            edit(&mut rows);
            changed.push(ReferenceCache::key(setup("ab12"), &rows));
        }
        for key in &changed {
            let key = key.as_deref().expect("key");
            assert_ne!(key, base);
        }
        let distinct: std::collections::BTreeSet<_> = changed.iter().flatten().collect();
        assert_eq!(distinct.len(), changed.len(), "{changed:?}");
    }

    #[test]
    fn an_entry_that_does_not_read_back_whole_is_none() {
        let good = encode(&outputs());
        assert!(decode(&good, &batches()).is_some());
        let mut trailing = good.clone();
        trailing.push(0);
        let mut magic = good.clone();
        magic[7] = b'2';
        let mut rows = good.clone();
        rows[8] = 4;
        let broken: [&[u8]; 5] = [&good[..good.len() - 1], &good[..12], &trailing, &magic, &rows];
        for bytes in broken {
            assert_eq!(decode(bytes, &batches()), None, "{} bytes", bytes.len());
        }
    }

    #[test]
    fn a_write_that_cannot_happen_fails_and_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        // The cache directory's place is a file: nothing can be created under it.
        let blocked = dir.path().join("file");
        std::fs::write(&blocked, b"x").expect("write");
        let cache = ReferenceCache::new(blocked.join("gate"));
        assert!(cache.store("k", &outputs()).is_err());
        // An entry whose final name is taken by a directory: the rename fails, the staging file goes.
        let cache = ReferenceCache::new(dir.path().join("gate"));
        std::fs::create_dir_all(cache.dir().join("k.ref/inside")).expect("mkdir");
        assert!(cache.store("k", &outputs()).is_err());
        let left: Vec<_> = std::fs::read_dir(cache.dir()).expect("dir").collect();
        assert_eq!(left.len(), 1, "only the directory in the way");
    }

    #[test]
    fn writers_sharing_the_directory_each_write_a_file_of_their_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = ReferenceCache::new(dir.path().join("gate"));
        // Another writer's file under the name this process's id alone would give: left alone.
        std::fs::create_dir_all(cache.dir()).expect("mkdir");
        let other = cache.dir().join(format!(".k.{}.tmp", std::process::id()));
        std::fs::write(&other, b"another writer's bytes").expect("write");
        // Writers of the same entry at once (as pods with one process id would be).
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| cache.store("k", &outputs()).expect("stored"));
            }
        });
        assert_eq!(std::fs::read(&other).expect("still there"), b"another writer's bytes");
        let bits = |o: &[RowOutput]| -> Vec<u32> {
            o.iter()
                .flat_map(|r| r.logits.iter().chain(&r.act_probabilities).map(|v| v.to_bits()))
                .collect()
        };
        let back = cache.load("k", &batches()).expect("kept whole");
        assert_eq!(bits(&back), bits(&outputs()));
        let names: Vec<String> = std::fs::read_dir(cache.dir())
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "the entry and the other writer's file: {names:?}");
    }
}
