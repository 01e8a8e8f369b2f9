use super::*;

fn params(extra: serde_json::Value) -> BackgroundParams {
    let mut args = serde_json::json!({"command": "python train.py"});
    for (k, v) in extra.as_object().unwrap() {
        args[k] = v.clone();
    }
    serde_json::from_value(args).unwrap()
}

#[test]
fn hook_parameters_are_refused() {
    for key in ["webhook_url", "event_command"] {
        let err = job_spec(&params(serde_json::json!({key: "x"}))).unwrap_err();
        assert!(
            err.contains("[hooks]") && err.contains("config file"),
            "{err}"
        );
    }
    // remote-sandbox-mcp sends "" for unset.
    assert!(job_spec(&params(serde_json::json!({"webhook_url": ""}))).is_ok());
}

#[test]
fn job_spec_maps_watch_parameters() {
    let spec = job_spec(&params(serde_json::json!({
        "session_name": "train", "cwd": "~/proj", "log_file": "",
        "checkpoint_path": "ckpt.json", "checkpoint_format": "json",
        "auto_resume": true, "resume_command": "python train.py --resume",
        "interval_s": 60, "metadata_json": "{\"owner\": \"me\"}",
    })))
    .unwrap();
    assert_eq!(spec.name.as_deref(), Some("train"));
    assert_eq!(spec.log_file, None);
    let w = &spec.watch;
    assert!(w.auto_resume);
    assert_eq!(
        (w.interval_s, w.resume_delay_s, w.max_resume_attempts),
        (60, 300, 1)
    );
    assert_eq!(w.checkpoint_format.as_deref(), Some("json"));
    let meta: serde_json::Value =
        serde_json::from_str(w.metadata_json.as_deref().unwrap()).unwrap();
    assert_eq!(meta, serde_json::json!({"owner": "me", "cwd": "~/proj"}));

    let spec = job_spec(&params(
        serde_json::json!({"cwd": "~/p/", "log_file": "./l/x.log"}),
    ));
    assert_eq!(spec.unwrap().log_file.as_deref(), Some("~/p/l/x.log"));
    let spec = job_spec(&params(
        serde_json::json!({"cwd": "/w", "log_file": "/tmp/x.log"}),
    ));
    assert_eq!(spec.unwrap().log_file.as_deref(), Some("/tmp/x.log"));
    let spec = job_spec(&params(serde_json::json!({"log_file": "x.log"})));
    assert_eq!(spec.unwrap().log_file.as_deref(), Some("x.log"));

    let spec = job_spec(&params(serde_json::json!({}))).unwrap();
    assert_eq!(spec.watch.checkpoint_format.as_deref(), Some("text"));
    assert_eq!(spec.watch.metadata_json, None);

    for (bad, word) in [
        (
            serde_json::json!({"checkpoint_format": "yaml"}),
            "checkpoint_format",
        ),
        (serde_json::json!({"auto_resume": true}), "resume_command"),
        (serde_json::json!({"metadata_json": "{"}), "metadata_json"),
        (serde_json::json!({"interval_s": -1}), "interval_s"),
        (serde_json::json!({"command": " "}), "empty"),
    ] {
        let err = job_spec(&params(bad)).unwrap_err();
        assert!(err.contains(word), "{err}");
    }
}

#[test]
fn slurm_settings_need_the_scheduler_and_refuse_the_daemons() {
    assert!(
        slurm_request(&params(serde_json::json!({})))
            .unwrap()
            .is_none()
    );
    let req = slurm_request(&params(serde_json::json!({
        "scheduler": "slurm", "gpus": 2, "time": "10", "partition": "gpu",
        "cwd": "~/p", "env": {"A": "1"}, "session_name": "",
    })))
    .unwrap()
    .unwrap();
    assert_eq!(
        (
            req.gpus,
            req.time.as_deref(),
            req.partition.as_deref(),
            req.cwd.as_deref()
        ),
        (Some(2), Some("10"), Some("gpu"), Some("~/p"))
    );
    assert_eq!(req.env, [("A".to_string(), "1".to_string())]);
    for (bad, word) in [
        (serde_json::json!({"gpus": 1}), "gpus only go with"),
        (
            serde_json::json!({"time": "5", "partition": "p"}),
            "time, partition",
        ),
        (serde_json::json!({"scheduler": "pbs"}), "scheduler must be"),
        (
            serde_json::json!({"scheduler": "slurm", "log_file": "x"}),
            "log_file",
        ),
        (
            serde_json::json!({"scheduler": "slurm", "auto_resume": true}),
            "auto_resume",
        ),
        (
            serde_json::json!({"scheduler": "slurm", "webhook_url": "x"}),
            "[hooks]",
        ),
        (
            serde_json::json!({"scheduler": "slurm", "env": {"LD_PRELOAD": "x"}}),
            "LD_PRELOAD",
        ),
    ] {
        let err = slurm_request(&params(bad.clone())).unwrap_err();
        assert!(err.contains(word), "{bad}: {err}");
    }
    // Agent jobs: the env goes into the spec, slurm-N names are taken.
    let spec = job_spec(&params(serde_json::json!({"env": {"A": "x y"}}))).unwrap();
    assert_eq!(spec.env, [("A".to_string(), "x y".to_string())]);
    let err = job_spec(&params(serde_json::json!({"session_name": "slurm-3"}))).unwrap_err();
    assert!(err.contains("slurm-"), "{err}");
    assert!(job_spec(&params(serde_json::json!({"env": {"PATH": "/x"}}))).is_ok());
    assert!(job_spec(&params(serde_json::json!({"env": {"BASH_ENV": "/x"}}))).is_err());
}

#[test]
fn limits_are_checked() {
    assert_eq!(
        seconds("t", None, 60.0, 3600.0),
        Ok(Duration::from_secs(60))
    );
    assert_eq!(seconds("t", Some(0.0), 60.0, 3600.0), Ok(Duration::ZERO));
    assert!(
        seconds("timeout_s", Some(-1.0), 60.0, 3600.0)
            .unwrap_err()
            .contains("timeout_s")
    );
    assert!(seconds("t", Some(3601.0), 60.0, 3600.0).is_err());
    assert!(seconds("t", Some(f64::NAN), 60.0, 3600.0).is_err());
    assert_eq!(log_bytes(None), Ok(DEFAULT_LOG_BYTES));
    assert_eq!(log_bytes(Some(u64::MAX)), Ok(jobs::MAX_LOG_BYTES));
    assert!(log_bytes(Some(0)).is_err());
}
