//! CPU tests of `cudnn_backend::plan::persist` (the persistent tuning file).

use std::fs;
use std::path::Path;

use cudnn_backend::config::Config;
use cudnn_backend::plan::cache::{CacheStats, ChoiceCache, EngineChoice, Outcome, Signature};
use cudnn_backend::plan::persist::{dir_from_env, TuningFile, TuningKey, TUNING_DIR_ENV};

fn key() -> TuningKey {
    TuningKey {
        gpu_name: "NVIDIA H200".into(),
        compute_capability: (9, 0),
        cudnn_version: 91400,
        crate_version: "0.1.0".into(),
    }
}

fn entries() -> Vec<(Signature, EngineChoice)> {
    vec![
        (
            Signature::new(vec![0, 1, 2, 255, 16]),
            EngineChoice {
                engine_id: 12,
                knobs: vec![(1, 4), (3, -1), (17, 1 << 40)],
                workspace_bytes: 1 << 33,
                measured_ms: Some(0.123_456_79),
            },
        ),
        (
            Signature::new(Vec::new()),
            EngineChoice {
                engine_id: -3,
                knobs: Vec::new(),
                workspace_bytes: 0,
                measured_ms: None,
            },
        ),
        (
            Signature::new((0..=255u8).collect()),
            EngineChoice {
                engine_id: 0,
                knobs: vec![(0, 0)],
                workspace_bytes: u64::MAX,
                measured_ms: Some(1e-30),
            },
        ),
    ]
}

fn saved(dir: &Path) -> std::path::PathBuf {
    let path = TuningFile::path_for(dir, &key());
    TuningFile::save(&path, &key(), &entries()).unwrap();
    path
}

#[test]
fn path_is_derived_from_sanitized_key() {
    let p = TuningFile::path_for(Path::new("/tmp/x"), &key());
    assert_eq!(p, Path::new("/tmp/x/tuning-NVIDIA_H200-sm90-cudnn91400.txt"));
    let odd = TuningKey {
        gpu_name: "GeForce RTX/5090 (A)".into(),
        compute_capability: (12, 0),
        ..key()
    };
    let p = TuningFile::path_for(Path::new("d"), &odd);
    assert_eq!(p, Path::new("d/tuning-GeForce_RTX_5090__A_-sm120-cudnn91400.txt"));
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path());
    assert_eq!(TuningFile::load(&path, &key()), entries());
    // Strings needing escapes survive too.
    let weird = TuningKey {
        gpu_name: "tab\there \\ new\nline".into(),
        crate_version: "1.0.0-rc.1\r".into(),
        ..key()
    };
    TuningFile::save(&path, &weird, &entries()).unwrap();
    assert_eq!(TuningFile::load(&path, &weird), entries());
    // Empty list.
    TuningFile::save(&path, &key(), &[]).unwrap();
    assert!(TuningFile::load(&path, &key()).is_empty());
}

#[test]
fn mismatched_key_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path());
    let others = [
        TuningKey {
            gpu_name: "NVIDIA H100".into(),
            ..key()
        },
        TuningKey {
            compute_capability: (9, 1),
            ..key()
        },
        TuningKey {
            cudnn_version: 91300,
            ..key()
        },
        TuningKey {
            crate_version: "0.2.0".into(),
            ..key()
        },
    ];
    for other in &others {
        assert!(TuningFile::load(&path, other).is_empty(), "{other:?}");
    }
    // Another format version is ignored too.
    let text = fs::read_to_string(&path).unwrap();
    fs::write(
        &path,
        text.replacen("cudnn-backend-tuning\t1", "cudnn-backend-tuning\t2", 1),
    )
    .unwrap();
    assert!(TuningFile::load(&path, &key()).is_empty());
}

#[test]
fn truncated_file_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path());
    let bytes = fs::read(&path).unwrap();
    for cut in [bytes.len() / 2, bytes.len() - 1, 1, 0] {
        fs::write(&path, &bytes[..cut]).unwrap();
        assert!(TuningFile::load(&path, &key()).is_empty(), "cut at {cut}");
    }
    // Cut at a line boundary (drop the last entry and the end line).
    let text = String::from_utf8(bytes.clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let shorter = lines[..lines.len() - 2].join("\n") + "\n";
    fs::write(&path, shorter).unwrap();
    assert!(TuningFile::load(&path, &key()).is_empty());
    // Drop one entry but keep the end line: the checksum catches it.
    let mut kept: Vec<&str> = lines.clone();
    kept.remove(2);
    fs::write(&path, kept.join("\n") + "\n").unwrap();
    assert!(TuningFile::load(&path, &key()).is_empty());
}

#[test]
fn garbage_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.txt");
    let mut junk: Vec<Vec<u8>> = vec![
        vec![0xff, 0xfe, 0x00, 0x80, b'\n'],
        b"hello\nworld\n".to_vec(),
        b"cudnn-backend-tuning\t1\n".to_vec(),
        b"\n\n\n".to_vec(),
        b"end\t0\t0000000000000000\n".to_vec(),
    ];
    // Pseudo-random bytes.
    let mut x: u32 = 12345;
    junk.push(
        (0..4096)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (x >> 16) as u8
            })
            .collect(),
    );
    // A valid file with one byte flipped, and with invalid UTF-8 inside.
    let good = fs::read(saved(dir.path())).unwrap();
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x01;
    junk.push(flipped);
    let mut bad_utf8 = good.clone();
    bad_utf8[good.len() / 3] = 0xff;
    junk.push(bad_utf8);
    for (i, j) in junk.iter().enumerate() {
        fs::write(&path, j).unwrap();
        assert!(TuningFile::load(&path, &key()).is_empty(), "junk #{i}");
    }
    // A directory where the file should be: ignored, no panic.
    let as_dir = dir.path().join("dir.txt");
    fs::create_dir(&as_dir).unwrap();
    assert!(TuningFile::load(&as_dir, &key()).is_empty());
}

#[test]
fn missing_file_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    assert!(TuningFile::load(&dir.path().join("nope.txt"), &key()).is_empty());
    assert!(TuningFile::load(&dir.path().join("no/such/dir/x.txt"), &key()).is_empty());
}

#[test]
fn save_overwrites_atomically_without_leftovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path());
    let fewer = &entries()[..1];
    TuningFile::save(&path, &key(), fewer).unwrap();
    assert_eq!(TuningFile::load(&path, &key()), fewer);
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![path.file_name().unwrap().to_owned()]);
    // Saving into a directory that does not exist yet creates it.
    let nested = dir.path().join("a/b");
    let p2 = TuningFile::path_for(&nested, &key());
    TuningFile::save(&p2, &key(), fewer).unwrap();
    assert_eq!(TuningFile::load(&p2, &key()), fewer);
    // Saving where the target is a directory fails and leaves no temp file.
    let blocker = dir.path().join("blocker");
    fs::create_dir_all(blocker.join("inner")).unwrap();
    assert!(TuningFile::save(&blocker, &key(), fewer).is_err());
    let count = fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(count, 3, "file, a/, blocker/");
}

#[test]
fn second_process_sees_saved_choices() {
    let dir = tempfile::tempdir().unwrap();
    let path = TuningFile::path_for(dir.path(), &key());
    // "Process" 1: tune and save.
    let first = ChoiceCache::new(100, CacheStats::new());
    for (k, v) in entries() {
        first.get_or_build(&k, || Ok::<_, ()>(v)).unwrap();
    }
    TuningFile::save(&path, &key(), &first.snapshot()).unwrap();
    // "Process" 2: a fresh cache filled from the file needs no builds.
    let stats = CacheStats::new();
    let second = ChoiceCache::new(100, stats.clone());
    second.extend(TuningFile::load(&path, &key()));
    assert_eq!(second.len(), 3);
    for (k, v) in entries() {
        let (got, outcome) = second
            .get_or_build(&k, || -> Result<EngineChoice, ()> { panic!("must not build") })
            .unwrap();
        assert_eq!((got, outcome), (v, Outcome::Hit));
    }
    assert_eq!(stats.snapshot().choice_builds, 0);
    // Recency order survives the round trip.
    let k1: Vec<_> = first.snapshot().into_iter().map(|e| e.0).collect();
    let fresh = ChoiceCache::new(100, CacheStats::new());
    fresh.extend(TuningFile::load(&path, &key()));
    let k2: Vec<_> = fresh.snapshot().into_iter().map(|e| e.0).collect();
    assert_eq!(k1, k2);
}

#[test]
fn dir_from_env_reads_the_variable() {
    let dir = |value: Option<&'static str>| Config::from_vars(|k| value.filter(|_| k == TUNING_DIR_ENV)).tuning_dir;
    assert_eq!(dir(Some("/some/dir")).as_deref(), Some(Path::new("/some/dir")));
    assert_eq!(dir(Some("")), None);
    assert_eq!(dir(None), None);
    // The process's value is the configuration's.
    assert_eq!(dir_from_env(), cudnn_backend::config::config().tuning_dir);
}
