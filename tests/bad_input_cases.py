"""Every bad input the commands refuse, with its exit status and the one line it prints: the one list that the
tests check (tests/test_bad_input.py runs the cases that are a command line; the tests named in ``checked_by``
set the scene for the others) and that the reliability page shows (docs/hooks.py builds its table from
`CASES`), so the page cannot drift from what the tests check.

A message is the line on stderr with the paths a test made written as placeholders (``{tmp}``, the test's
folder; ``{finished}``, a finished two-round FedAvg run; see `PLACEHOLDERS`), a lock holder's process as
``process PID on HOST``, and ``…`` standing for text that depends on the machine (searched folders, versions).
"""

from __future__ import annotations

import dataclasses
import re

BAD_INPUT = 2
INTERRUPTED, OUTPUT_CLOSED, TERMINATED = 130, 141, 143  # 128 + SIGINT, SIGPIPE, SIGTERM

TINY = ["--dataset", "synthetic", "--model", "mlr", "--num-clients", "6", "--partition", "natural",
        "--local-epochs", "1", "--rounds", "2", "--no-progress"]
TRAIN = ["--method", "fedavg", *TINY]
REPRODUCE = ["--table-file", "{tmp}/table.yaml", "--no-progress"]
REPORT = ["{finished}"]

# What the placeholders of the arguments and messages stand for (the page's legend).
PLACEHOLDERS = {
    "tmp": "a folder of the test's: it holds a_file (a file), bad.yaml (broken YAML), twice.yaml (two train: "
           "blocks), table.yaml (a paper table), empty/ (an empty folder) and damaged copies of the finished run (the "
           "placeholders below)",
    "finished": "a finished two-round FedAvg run (checkpoint every round)",
    "empty": "an empty folder ({tmp}/empty)",
    "truncated": "a copy of the finished run whose checkpoint files are cut in half ({tmp}/truncated)",
    "corrupted": "a copy of the finished run whose checkpoint files begin with 64 zero bytes ({tmp}/corrupted)",
    "no_metrics": "a copy of the finished run without metrics.jsonl ({tmp}/no_metrics)",
    "no_digests": "a copy of the finished run without its checkpoint's digests.json ({tmp}/no_digests)",
    "emptied_checkpoint": "a copy of the finished run whose checkpoint's files are all deleted ({tmp}/emptied_checkpoint)",
    "scattered": "a copy of the finished run with bytes flipped in every checkpoint file ({tmp}/scattered)",
    "bad_summary": "a copy of the finished run whose summary.json is cut short ({tmp}/bad_summary)",
}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    given: str  # what the user does, in words
    message: str  # the line on stderr (see the module docstring)
    argv: tuple[str, ...] | None = None  # the command line (placeholders); None: a test sets the scene
    command: str = "train"  # train, reproduce or report
    exit: int = BAD_INPUT
    checked_by: str = ""  # the test that runs a case without argv

    def shown_command(self) -> str:
        """The command line as the page shows it."""
        if self.argv is None:
            return f"(set up by {self.checked_by})"
        return f"python -m fedjax_pfl.{self.command} {' '.join(self.argv)}"


def _argv(*parts) -> tuple[str, ...]:
    return tuple(str(p) for p in parts)


CASES_LIST: list[Case] = [
    # the command lines tests/test_bad_input.py runs
    Case('yaml_syntax', 'yaml syntax',
         "error: {tmp}/bad.yaml is not valid YAML at line 3, column 1: expected the node content, but found '<stream end>'; fix the file",
         _argv('--method', 'fedavg', '--config', '{tmp}/bad.yaml')),
    Case('out_is_a_file', 'out is a file',
         'error: --out {tmp}/a_file is a file, not a folder; choose another --out',
         _argv('--method', 'fedavg', *TINY, '--out', '{tmp}/a_file')),
    Case('out_under_a_file', 'out under a file',
         'error: --out {tmp}/a_file/run lies under {tmp}/a_file, which is a file; choose another --out',
         _argv('--method', 'fedavg', *TINY, '--out', '{tmp}/a_file/run')),
    Case('out_not_writable', 'out not writable',
         'error: cannot write in /sys (permission denied or read-only); choose another --out',
         _argv('--method', 'fedavg', *TINY, '--out', '/sys/fedjax_pfl_run')),
    Case('unknown_client_mapping', 'unknown client mapping',
         "error: train.client_mapping: unknown client mapping 'nosuch'; choose auto, vmap, map, chunked, packed or packed:W (W lanes, a whole number >= 1)",
         _argv('--method', 'fedavg', *TINY, '--client-mapping', 'nosuch')),
    Case('packed_without_lanes', 'packed without lanes',
         "error: train.client_mapping: client mapping 'packed:0': W in packed:W must be a whole number >= 1 (lanes), got '0'; or give packed alone for W from the data",
         _argv('--method', 'fedavg', *TINY, '--client-mapping', 'packed:0')),
    Case('packed_lanes_not_a_number', 'packed lanes not a number',
         "error: train.client_mapping: client mapping 'packed:many': W in packed:W must be a whole number >= 1 (lanes), got 'many'; or give packed alone for W from the data",
         _argv('--method', 'fedavg', *TINY, '--client-mapping', 'packed:many')),
    Case('negative_momentum', 'negative momentum',
         'error: train.momentum must be in [0, 1), got -1.0',
         _argv('--method', 'fedavg', *TINY, '--momentum', '-1')),
    Case('negative_checkpoint_every', 'negative checkpoint every',
         'error: checkpoint_every must be >= 0, got -1',
         _argv('--method', 'fedavg', *TINY, '--checkpoint-every', '-1')),
    Case('negative_fedprox_mu', 'negative fedprox mu',
         'error: method.mu must be >= 0, got -1.0',
         _argv('--method', 'fedprox', *TINY, 'method.mu=-1')),
    Case('unknown_option', 'unknown option',
         'error: unrecognized arguments: --nosuch 3 (see --help; overrides look like key.sub=value)',
         _argv('--method', 'fedavg', *TINY, '--nosuch', '3')),
    Case('flag_needs_a_number', 'flag needs a number',
         "error: argument --lr: invalid float value: 'fast' (see --help)",
         _argv('--method', 'fedavg', *TINY, '--lr', 'fast')),
    Case('bad_override_yaml', 'bad override yaml',
         "error: override 'train.lr=[1,': the value is not valid YAML; quote it",
         _argv('--method', 'fedavg', *TINY, 'train.lr=[1,')),
    Case('shared_body_on_mlr', 'shared body on mlr',
         "error: method 'fedper' shares the model's body, but 'mlr' has no body parameters (its feature is the input); choose a model with a body, e.g. --model mlp",
         _argv('--method', 'fedper', *TINY)),
    Case('unknown_augment', 'unknown augment',
         "error: train.augment must be one of: none, crop_flip, got 'rotate'",
         _argv('--method', 'fedavg', *TINY, 'train.augment=rotate')),
    Case('augment_features', 'augment features',
         'error: train.augment=crop_flip crops and flips images; data.name=synthetic has feature vectors: leave it none',
         _argv('--method', 'fedavg', *TINY, 'train.augment=crop_flip')),
    Case('eval_model_not_offered', 'eval model not offered',
         "error: method 'fedavg' evaluates with eval.model = global, not 'local'",
         _argv('--method', 'fedavg', *TINY, '--eval-model', 'local')),
    Case('data_dir_missing', 'data dir missing',
         'error: --data-dir {tmp}/nonexistent is not a folder; pass the folder that holds the dataset files or leave it out',
         _argv('--method', 'fedavg', '--dataset', 'mnist', '--data-dir', '{tmp}/nonexistent')),
    Case('resume_nothing_there', 'resume nothing there',
         'error: nothing to resume in {tmp}/empty (no readable config.json); run without --resume to start afresh',
         _argv('--method', 'fedavg', *TINY, '--out', '{empty}', '--resume')),
    Case('resume_without_out', 'resume without out',
         'error: --resume needs --out FOLDER, the folder of the run to continue',
         _argv('--method', 'fedavg', *TINY, '--resume')),
    Case('resume_truncated_checkpoint', 'resume truncated checkpoint',
         'error: checkpoint {tmp}/truncated/checkpoint is truncated or corrupted (…); it cannot be resumed: start the run afresh (in place with --start-over, or in a new --out)',
         _argv('--method', 'fedavg', *TINY, '--checkpoint-every', '1', '--out', '{truncated}', '--resume', '--rounds', '3')),
    Case('resume_corrupted_checkpoint', 'resume corrupted checkpoint',
         'error: checkpoint {tmp}/corrupted/checkpoint is truncated or corrupted (…); it cannot be resumed: start the run afresh (in place with --start-over, or in a new --out)',
         _argv('--method', 'fedavg', *TINY, '--checkpoint-every', '1', '--out', '{corrupted}', '--resume', '--rounds', '3')),
    Case('resume_finished_run', 'resume finished run',
         'error: the run in {finished} already finished its 2 rounds; to extend it, pass a larger --rounds with --resume',
         _argv('--method', 'fedavg', *TINY, '--checkpoint-every', '1', '--out', '{finished}', '--resume')),
    Case('resume_other_method', 'resume other method',
         'error: --resume continues the fedavg run in {finished}; --method fedprox would change its method: leave --method out (or pass --method fedavg), or run fedprox in another --out',
         _argv('--method', 'fedprox', *TINY, '--checkpoint-every', '1', '--out', '{finished}', '--resume')),
    Case('resume_with_a_method_without_options', 'resume with a method without options',
         'error: --resume continues the fedavg run in {finished}; --method fedper would change its method: leave --method out (or pass --method fedavg), or run fedper in another --out',
         _argv('--method', 'fedper', *TINY, '--out', '{finished}', '--resume')),
    Case('start_over_with_resume', 'start over with resume',
         'error: --resume continues the run in --out and --start-over replaces it: pass one of them',
         _argv('--method', 'fedavg', *TINY, '--out', '{finished}', '--resume', '--start-over')),
    Case('resume_other_lr', 'resume other lr',
         'error: --resume must use the configuration the run was started with; changed: train.lr: 0.005 -> 0.1 (only train.rounds may grow)',
         _argv('--method', 'fedavg', *TINY, '--checkpoint-every', '1', '--out', '{finished}', '--resume', '--lr', '0.1')),
    Case('resume_fewer_rounds', 'resume fewer rounds',
         'error: the checkpoint is after round 2; --rounds must be more than 2',
         _argv('--out', '{finished}', '--resume', '--rounds', '1')),
    Case('rerun_into_finished_folder', 'rerun into finished folder',
         'error: {finished} already holds a run; continue it with --resume, start it afresh in place with --start-over, or choose another --out',
         _argv('--method', 'fedavg', *TINY, '--out', '{finished}')),
    Case('list_of_an_untraceable_option', 'list of an untraceable option',
         "error: method.finetune_epochs cannot be a list for method 'fedavg': only lr vary inside one program; run other settings one by one",
         _argv('--method', 'fedavg', *TINY, 'method.finetune_epochs=[1,2]')),
    Case('list_of_non_numbers', 'list of non numbers',
         "error: method.mu must be a non-empty list of numbers, got ['a', 'b']",
         _argv('--method', 'fedprox', *TINY, 'method.mu=[a,b]')),
    Case('seeds_not_numbers', 'seeds not numbers',
         "error: --seeds takes comma-separated whole numbers >= 0, e.g. 0,1,2; got 'a,b'",
         _argv('--method', 'fedavg', *TINY, '--seeds', 'a,b')),
    Case('seeds_repeated', 'seeds repeated',
         'error: seeds must be distinct numbers >= 0, got [1, 1]',
         _argv('--method', 'fedavg', *TINY, '--seeds', '1,1')),
    Case('resume_a_sweep', 'resume a sweep',
         'error: --resume continues one run: resume a point of a sweep in its own folder (e.g. --out RUN/seed1 --resume)',
         _argv('--out', '{finished}', '--resume', '--rounds', '3', '--seeds', '0,1')),
    Case('lr_decay_above_one', 'lr decay above one',
         'error: train.lr_decay must be in (0, 1], got 1.5',
         _argv('--method', 'fedavg', *TINY, 'train.lr_decay=1.5')),
    Case('val_fraction_one', 'val fraction one',
         'error: partition.val_fraction must be in [0, 1), got 1.0',
         _argv('--method', 'fedavg', *TINY, 'partition.val_fraction=1')),
    Case('unknown_precision', 'unknown precision',
         "error: train.precision must be one of: fp32, bf16, got 'fp16'",
         _argv('--method', 'fedavg', *TINY, 'train.precision=fp16')),
    Case('unknown_conv_impl', 'unknown conv impl',
         "error: model.conv_impl must be one of: auto, direct, im2col, native, pallas, got 'winograd'",
         _argv('--method', 'fedavg', *TINY, 'model.conv_impl=winograd')),
    Case('out_not_writable-train', 'out not writable',
         'error: cannot write in /proc (permission denied or read-only); choose another --out',
         _argv('--method', 'fedavg', *TINY, '--out', '/proc/fedjax_pfl_x')),
    Case('out_not_writable-reproduce', 'out not writable',
         'error: cannot write in /proc (permission denied or read-only); choose another --out',
         _argv(*REPRODUCE, '--out', '/proc/fedjax_pfl_x'), command='reproduce'),
    Case('out_not_writable-report', 'out not writable',
         'error: cannot write in /proc (permission denied or read-only); choose another --out',
         _argv(*REPORT, '--out', '/proc/fedjax_pfl_x'), command='report'),
    Case('out_is_a_file-reproduce', 'out is a file',
         'error: --out {tmp}/a_file is a file, not a folder; choose another --out',
         _argv(*REPRODUCE, '--out', '{tmp}/a_file'), command='reproduce'),
    Case('out_is_a_file-report', 'out is a file',
         'error: --out {tmp}/a_file is a file, not a folder; choose another --out',
         _argv(*REPORT, '--out', '{tmp}/a_file'), command='report'),
    Case('out_under_a_file-train', 'out under a file',
         'error: --out {tmp}/a_file/x lies under {tmp}/a_file, which is a file; choose another --out',
         _argv('--method', 'fedavg', *TINY, '--out', '{tmp}/a_file/x')),
    Case('out_under_a_file-reproduce', 'out under a file',
         'error: --out {tmp}/a_file/x lies under {tmp}/a_file, which is a file; choose another --out',
         _argv(*REPRODUCE, '--out', '{tmp}/a_file/x'), command='reproduce'),
    Case('out_under_a_file-report', 'out under a file',
         'error: --out {tmp}/a_file/x lies under {tmp}/a_file, which is a file; choose another --out',
         _argv(*REPORT, '--out', '{tmp}/a_file/x'), command='report'),
    Case('unknown_flag-reproduce', 'unknown flag',
         'error: unrecognized arguments: --nosuch (see --help; overrides look like key.sub=value)',
         _argv(*REPRODUCE, '--nosuch', '3'), command='reproduce'),
    Case('unknown_flag-report', 'unknown flag',
         'error: unrecognized arguments: --nosuch 3 (see --help)',
         _argv(*REPORT, '--nosuch', '3'), command='report'),
    Case('no_input_named-reproduce', 'no input named',
         'error: name a table (see --list), or pass --table-file FILE',
         _argv(), command='reproduce'),
    Case('no_input_named-report', 'no input named',
         'error: the following arguments are required: RUN_DIR (see --help)',
         _argv(), command='report'),
    Case('input_missing-train', 'input missing',
         'error: config file {tmp}/nosuch.yaml not found (presets live in configs/)',
         _argv('--method', 'fedavg', *TINY, '--config', '{tmp}/nosuch.yaml')),
    Case('input_missing-reproduce', 'input missing',
         'error: config file {tmp}/nosuch.yaml not found (presets live in configs/)',
         _argv('--table-file', '{tmp}/nosuch.yaml'), command='reproduce'),
    Case('input_missing-report', 'input missing',
         'error: no such folder: {tmp}/nosuch; pass run folders written by python -m fedjax_pfl.train',
         _argv('{tmp}/nosuch'), command='report'),
    Case('input_not_yaml-train', 'input not yaml',
         "error: {tmp}/bad.yaml is not valid YAML at line 3, column 1: expected the node content, but found '<stream end>'; fix the file",
         _argv('--method', 'fedavg', *TINY, '--config', '{tmp}/bad.yaml')),
    Case('input_not_yaml-reproduce', 'input not yaml',
         "error: {tmp}/bad.yaml is not valid YAML at line 3, column 1: expected the node content, but found '<stream end>'; fix the file",
         _argv('--table-file', '{tmp}/bad.yaml'), command='reproduce'),
    Case('flag_needs_a_number-train', 'flag needs a number',
         "error: argument --rounds: invalid int value: 'many' (see --help)",
         _argv('--method', 'fedavg', *TINY, '--rounds', 'many')),
    Case('flag_needs_a_number-reproduce', 'flag needs a number',
         "error: argument --rounds: invalid int value: 'many' (see --help)",
         _argv(*REPRODUCE, '--rounds', 'many'), command='reproduce'),
    Case('number_too_large_for_jax-train', 'number too large for jax',
         'error: train.rounds must be finite and at most 2147483647 (int32) in size, got 99999999999999',
         _argv('--method', 'fedavg', *TINY, '--rounds', '99999999999999')),
    Case('number_too_large_for_jax-reproduce', 'number too large for jax',
         'error: --rounds must be a whole number from 1 to 2147483647, got 99999999999999',
         _argv(*REPRODUCE, '--rounds', '99999999999999'), command='reproduce'),
    Case('no_rounds-train', 'no rounds',
         'error: train.rounds must be >= 1, got 0',
         _argv('--method', 'fedavg', *TINY, '--rounds', '0')),
    Case('no_rounds-reproduce', 'no rounds',
         'error: --rounds must be a whole number from 1 to 2147483647, got 0',
         _argv(*REPRODUCE, '--rounds', '0'), command='reproduce'),
    Case('option_too_large_for_jax-train', 'option too large for jax',
         'error: method.finetune_epochs must be finite and at most 2147483647 (int32) in size, got 99999999999',
         _argv('--method', 'fedavg', *TINY, 'method.finetune_epochs=99999999999')),
    Case('option_too_large_for_jax-reproduce', 'option too large for jax',
         'error: method.finetune_epochs must be finite and at most 2147483647 (int32) in size, got 99999999999',
         _argv(*REPRODUCE, 'method.finetune_epochs=99999999999'), command='reproduce'),
    Case('float_too_large_for_jax-train', 'float too large for jax',
         'error: train.lr must be finite and at most 3.403e+38 (float32) in size, got 1e+39',
         _argv('--method', 'fedavg', *TINY, '--lr', '1e39')),
    Case('float_too_large_for_jax-reproduce', 'float too large for jax',
         'error: train.lr must be finite and at most 3.403e+38 (float32) in size, got 1e+39',
         _argv(*REPRODUCE, 'train.lr=1e39'), command='reproduce'),
    Case('seeds_with_an_empty_item-train', 'seeds with an empty item',
         "error: --seeds takes comma-separated whole numbers >= 0, e.g. 0,1,2; got '0,,1'",
         _argv('--method', 'fedavg', *TINY, '--seeds', '0,,1')),
    Case('seeds_with_an_empty_item-reproduce', 'seeds with an empty item',
         "error: --seeds takes comma-separated whole numbers >= 0, e.g. 0,1,2; got '0,,1'",
         _argv(*REPRODUCE, '--seeds', '0,,1'), command='reproduce'),
    Case('seeds_negative-train', 'seeds negative',
         "error: --seeds takes comma-separated whole numbers >= 0, e.g. 0,1,2; got '0,-1'",
         _argv('--method', 'fedavg', *TINY, '--seeds=0,-1')),
    Case('seeds_negative-reproduce', 'seeds negative',
         "error: --seeds takes comma-separated whole numbers >= 0, e.g. 0,1,2; got '0,-1'",
         _argv(*REPRODUCE, '--seeds=0,-1'), command='reproduce'),
    Case('negative_rounds_per_call-train', 'negative rounds per call',
         'error: train.rounds_per_call must be >= 0, got -1',
         _argv('--method', 'fedavg', *TINY, '--rounds-per-call', '-1')),
    Case('negative_rounds_per_call-reproduce', 'negative rounds per call',
         'error: train.rounds_per_call must be >= 0, got -1',
         _argv(*REPRODUCE, 'train.rounds_per_call=-1'), command='reproduce'),
    Case('unknown_config_key-train', 'unknown config key',
         "error: unknown config key 'train.nosuch'; valid keys here: …",
         _argv('--method', 'fedavg', *TINY, 'train.nosuch=1')),
    Case('unknown_config_key-reproduce', 'unknown config key',
         "error: unknown config key 'train.nosuch'; valid keys here: …",
         _argv(*REPRODUCE, 'train.nosuch=1'), command='reproduce'),
    Case('data_dir_missing-train', 'data dir missing',
         'error: --data-dir {tmp}/nonexistent is not a folder; pass the folder that holds the dataset files or leave it out',
         _argv('--method', 'fedavg', '--dataset', 'synthetic', '--model', 'mlr', '--num-clients', '6', '--partition', 'natural', '--local-epochs', '1', '--rounds', '2', '--no-progress', '--dataset', 'mnist', '--data-dir', '{tmp}/nonexistent')),
    Case('data_dir_missing-reproduce', 'data dir missing',
         'error: --data-dir {tmp}/nonexistent is not a folder; pass the folder that holds the dataset files or leave it out',
         _argv(*REPRODUCE, 'data.name=mnist', '--data-dir', '{tmp}/nonexistent'), command='reproduce'),
    # unclean endings that a command line shows: damaged records, environment, input past the limits
    Case('yaml_key_twice', 'a YAML preset with two train: blocks (plain YAML keeps the second silently)',
         "error: {tmp}/twice.yaml gives the key 'train' twice, at line 1 and at line 4 (YAML would keep only the second); merge them into one",
         _argv('--method', 'fedavg', *TINY, '--config', '{tmp}/twice.yaml')),
    Case('lr_zero_in_float32', 'a learning rate that is 0 in float32',
         'error: train.lr=1e-50 is 0 in float32, the precision the run computes in (its smallest normal number is 1.175e-38); give a value at least that large',
         _argv('--method', 'fedavg', *TINY, '--lr', '1e-50')),
    Case('option_zero_in_float32', "a method option that is 0 in float32",
         'error: method.mu=1e-45 is 0 in float32, the precision the run computes in (its smallest normal number is 1.175e-38); give a value at least that large',
         _argv('--method', 'fedprox', *TINY, 'method.mu=1e-45')),
    Case('batch_larger_than_every_client', 'a batch larger than every client',
         'error: train.batch_size 100000 is larger than every client (the largest holds 184 train samples); use --batch-size 184 or less',
         _argv('--method', 'fedavg', *TINY, '--batch-size', '100000')),
    Case('cpu_devices_past_clients', 'more host devices than clients (each holds a padded copy of the data)',
         "error: devices.cpu=64 is more host devices than the run's 6 clients (each device holds a copy of the client data, padded to a client per device); use --cpu-devices 6 or fewer, or leave it auto",
         _argv('--method', 'fedavg', *TINY, '--cpu-devices', '64')),
    Case('out_name_too_long', 'a 300-character --out name',
         'error: --out holds a folder name of 300 characters (aaaaaaaaaaaa...), more than the … this file system allows for one name; choose a shorter --out',
         _argv('--method', 'fedavg', *TINY, '--out', '{tmp}/' + 'a' * 300)),
    Case('out_past_path_max', 'an --out path longer than the system allows (PATH_MAX)',
         'error: --out is … characters long as an absolute path; the files a run writes inside it need 200 more, past the … this system allows for a path: choose a shorter --out',
         _argv('--method', 'fedavg', *TINY, '--out', '{tmp}/' + '/'.join(['b' * 200] * 21))),
    Case('client_arrays_past_memory', '100,000 Synthetic clients of FedProx\'s lognormal sizes (the largest holds '
         '700,000 samples): their padded arrays, refused before a sample is drawn, naming changes that fit',
         "error: this run would take … TB of host memory, more than the … available (…: process …, samples 11.4 GB, "
         "…client arrays … TB…); it fits with …data.synthetic_samples_per_client=50 (about …",
         _argv('--method', 'fedavg', '--dataset', 'synthetic', '--model', 'mlr', '--num-clients', '100000',
               '--partition', 'natural', '--join-ratio', '0.0005', '--rounds', '1', '--no-progress')),
    Case('client_arrays_past_memory_repartitioned', '100,000 Synthetic clients of FedProx\'s lognormal sizes '
         're-partitioned by the default Dirichlet split: refused before a sample is drawn, by a lower bound (the '
         'pool twice, while partitioned, and arrays at least the size of the pool)',
         "error: this run would take at least … GB of host memory, more than the … available (making the data: "
         "process …, samples 22.8 GB, partition 1.7 GB, client arrays 11.2 GB, host copy 11.2 GB); it fits with "
         "--partition natural data.synthetic_samples_per_client=50 (about …",
         _argv('--method', 'fedavg', '--dataset', 'synthetic', '--model', 'mlr', '--num-clients', '100000',
               '--join-ratio', '0.0005', '--rounds', '2', '--local-epochs', '1', '--no-progress')),
    Case('resume_without_metrics', '--resume after metrics.jsonl was deleted',
         "error: {tmp}/no_metrics/metrics.jsonl is missing, though the checkpoint is after round 2: resuming would drop them from the run's history and summary; restore the file (e.g. from a backup), or start the run afresh (in place with --start-over, or in a new --out)",
         _argv('--method', 'fedavg', *TINY, '--checkpoint-every', '1', '--out', '{no_metrics}', '--resume', '--rounds', '3')),
    Case('resume_without_digests', "--resume after the checkpoint's digests.json was deleted",
         'error: checkpoint {tmp}/no_digests/checkpoint holds round 2 without its digests.json (deleted, or saved by a version before checkpoints recorded their digests), so its files cannot be checked against damage; it cannot be resumed: start the run afresh (in place with --start-over, or in a new --out)',
         _argv('--method', 'fedavg', *TINY, '--checkpoint-every', '1', '--out', '{no_digests}', '--resume', '--rounds', '3')),
    Case('resume_emptied_checkpoint', "--resume after every file of the checkpoint was deleted (its folders left)",
         'error: checkpoint {tmp}/emptied_checkpoint/checkpoint holds round 2 without its digests.json (deleted, or saved by a version before checkpoints recorded their digests), so its files cannot be checked against damage; it cannot be resumed: start the run afresh (in place with --start-over, or in a new --out)',
         _argv('--method', 'fedavg', *TINY, '--checkpoint-every', '1', '--out', '{emptied_checkpoint}', '--resume', '--rounds', '3')),
    Case('resume_scattered_damage', '--resume of a checkpoint with bytes flipped here and there in every file',
         'error: checkpoint {tmp}/scattered/checkpoint is truncated or corrupted (…); it cannot be resumed: start the run afresh (in place with --start-over, or in a new --out)',
         _argv('--method', 'fedavg', *TINY, '--checkpoint-every', '1', '--out', '{scattered}', '--resume', '--rounds', '3')),
    Case('report_damaged_summary', 'a report of a run whose summary.json is damaged',
         'error: {tmp}/bad_summary/summary.json is damaged (not JSON: Unterminated string starting at: line 1 column 12 (char 11)); delete it (the run then counts as unfinished) or restore it from a backup',
         _argv('{bad_summary}', '--out', '{tmp}/report'), command='report'),
    # set up by the tests named in checked_by
    Case("second_writer", "a second run on the --out folder of a run in progress (two started together)",
         "error: --out {tmp}/run is being written by another run (process PID on HOST); wait until it ends, or "
         "choose another --out", checked_by="test_two_runs_started_together_on_one_folder_one_runs_the_other_is_refused"),
    Case("not_a_run_folder", "--out names a folder of the user's own files (notes.txt, metrics.csv, plots/)",
         "error: --out {tmp}/mine holds files that are not a run's (metrics.csv, notes.txt, plots); a run writes "
         "into a new or empty folder (or its own): choose another --out",
         checked_by="test_a_folder_of_other_files_is_refused_and_left_unchanged"),
    Case("resume_without_a_checkpoint", "--resume of a run killed during its first checkpoint's save",
         "error: the run in {tmp}/run has no complete checkpoint (it stopped before its first one was saved, or "
         "during that save), so it cannot be continued: start it afresh in place with --start-over, or choose "
         "another --out", checked_by="test_a_kill_during_the_first_checkpoint_save_can_be_started_over_in_place"),
    Case("rerun_without_a_checkpoint", "the same run again (no --resume) in that folder",
         "error: the run in {tmp}/run has no complete checkpoint (it stopped before its first one was saved, or "
         "during that save), so it cannot be continued: start it afresh in place with --start-over, or choose "
         "another --out", checked_by="test_a_kill_during_the_first_checkpoint_save_can_be_started_over_in_place"),
    Case("rerun_finished_without_checkpoints", "the same run again (no --resume) in the folder of a finished run "
         "that kept no checkpoints (the default --checkpoint-every 0)",
         "error: the run in {tmp}/run finished without keeping a checkpoint (--checkpoint-every 0), so it cannot be "
         "continued: start it afresh in place with --start-over, or choose another --out",
         checked_by="test_a_finished_run_without_checkpoints_is_named_finished_and_starts_over_in_place"),
    Case("resume_finished_without_checkpoints", "--resume of a finished run that kept no checkpoints",
         "error: the run in {tmp}/run finished without keeping a checkpoint (--checkpoint-every 0), so it cannot be "
         "continued: start it afresh in place with --start-over, or choose another --out",
         checked_by="test_a_finished_run_without_checkpoints_is_named_finished_and_starts_over_in_place"),
    Case("sigterm_mid_run", "SIGTERM (a batch scheduler's stop) in round 2 of 3: the run stops after the round "
         "with a checkpoint and summary.json (status interrupted); --resume continues it",
         "SIGTERM: stopping after round 2 of 3, with a checkpoint and the summary; continue later with --resume "
         "(Ctrl-C or SIGTERM again stops at once, keeping only what was saved)", exit=TERMINATED,
         checked_by="test_sigterm_mid_run_writes_an_interrupted_summary_and_resume_continues_exactly"),
    Case("unknown_xla_flag", "XLA_FLAGS naming a flag XLA does not know (XLA itself aborts the process)",
         "error: XLA_FLAGS holds --xla_fedjax_pfl_no_such_flag=1, a flag the XLA of this jax (…) does not know, and "
         "XLA would abort; remove it from XLA_FLAGS",
         checked_by="test_a_platform_jax_cannot_start_and_a_flag_xla_does_not_know_are_one_line_each"),
    Case("jax_platforms_unavailable", "JAX_PLATFORMS=cuda on a machine without a GPU",
         "error: JAX_PLATFORMS=cuda: JAX cannot start that platform on this machine (…); set JAX_PLATFORMS to one it "
         "has (cpu is always there), or unset it",
         checked_by="test_a_platform_jax_cannot_start_and_a_flag_xla_does_not_know_are_one_line_each"),
    Case("stdout_full", "standard output sent to /dev/full (every write fails: no space)",
         "error: cannot write to standard output (No space left on device); send it where it can be written (a file "
         "on a disk with room, or /dev/null)",
         checked_by="test_standard_output_that_cannot_be_written_is_one_line_before_any_work"),
    Case("stdout_closed_before_rounds", "the output piped into | head -1, which goes once it has its line (the "
         "command ends as on SIGTERM: nothing was trained yet, no folder is left)",
         "output closed: interrupted; nothing more was written (a run with checkpoints continues with --resume)",
         exit=OUTPUT_CLOSED, checked_by="test_output_closed_while_loading_ends_the_command_at_once"),
    Case("stdout_closed_mid_run", "the reader of the output goes during round 1 of 3: the run stops after the "
         "round with a checkpoint and the summary; --resume continues it to the same records",
         "output closed: stopping after round 1 of 3, with a checkpoint and the summary; continue later with --resume "
         "(Ctrl-C or SIGTERM again stops at once, keeping only what was saved)", exit=OUTPUT_CLOSED,
         checked_by="test_output_closed_mid_run_stops_with_a_checkpoint_and_resume_continues_exactly"),
    Case("ctrl_c_in_a_long_computation", "Ctrl-C while the main thread waits on a long compiled call (a compile, "
         "a round): ended within seconds, by the main thread or, if it does not answer, by a watcher that adds "
         "'stopped at once, the computation in flight would not give way'",
         "Ctrl-C: interrupted; nothing more was written…", exit=INTERRUPTED,
         checked_by="test_a_stop_signal_ends_the_command_while_its_main_thread_waits_on_a_computation"),
    Case("sigterm_in_a_long_computation", "SIGTERM while the main thread waits on a long compiled call (as Ctrl-C)",
         "SIGTERM: interrupted; nothing more was written…", exit=TERMINATED,
         checked_by="test_a_stop_signal_ends_the_command_while_its_main_thread_waits_on_a_computation"),
    Case("seeds_past_open_files", "600 seeds under ulimit -n 1024 (each run folder keeps its lock and metrics "
         "open): refused before a folder is made",
         "error: 600 runs in one sweep keep about 1456 files open at once (each run folder's lock and metrics.jsonl), "
         "more than this process may open (1024, ulimit -Hn); run at most 384 seeds or grid points at a time, or "
         "raise the limit (ulimit -n)",
         checked_by="test_more_runs_than_the_process_may_keep_files_open_is_refused_before_any_work"),
    Case("tensorboard_missing", "--tensorboard without tensorboardX installed: refused before the data load",
         "error: --tensorboard (log.tensorboard=true) needs tensorboardX: pip install 'fedjax_pfl[tensorboard]', or "
         "run without it", checked_by="test_tensorboard_without_tensorboardx_is_refused_before_the_data_load"),
    Case("disk_full_mid_run", "the disk of the run folder fills up after round 2 of 4 (a small tmpfs, or a "
         "file-size limit): the run stops; its records and its last checkpoint stay, and --resume once space is freed "
         "continues to the records of a run that never stopped",
         "error: no space left on the disk holding {tmp}/disk/run (…): the run stopped; metrics.jsonl keeps its "
         "records up to round … and its checkpoint after round …; free space there (or raise the file-size limit, "
         "ulimit -f), then continue the run with --resume",
         checked_by="test_a_full_disk_stops_the_run_with_one_line_and_resume_continues_exactly"),
    Case("bit_flipped_gzip", "a dataset file with a flipped byte (MNIST's train labels); no run folder is made",
         "error: {tmp}/mnist/train-labels-idx1-ubyte.gz does not match the published checksum of "
         "train-labels-idx1-ubyte.gz (md5 …, expected d53e105ee54ea40749a09fcbcd1e9432; not a readable gzip file "
         "(Error -3 while decompressing data: invalid distance too far back)): it is corrupt, truncated or another "
         "version. Delete it and supply the original file (from "
         "https://ossci-datasets.s3.amazonaws.com/mnist/train-labels-idx1-ubyte.gz).",
         checked_by="test_a_bit_flipped_gzip_is_one_line_exit_2_and_no_folder"),
    Case("data_dir_without_the_file", "--data-dir names an empty folder (the file is nowhere else)",
         "error: Dataset file train-images-idx3-ubyte.gz not found; searched: {tmp}/empty/mnist, {tmp}/empty, … "
         "Supply it: put it in DIR/mnist/ (or DIR itself) and pass --data-dir DIR, or allow downloading it from "
         "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz (allow_download=True; the "
         "training command downloads with --download and without --data-dir). To try the library without any "
         "files, use --dataset synthetic.",
         checked_by="test_a_data_dir_without_the_files_says_how_to_get_them"),
]

CASES = {case.name: case for case in CASES_LIST}
assert len(CASES) == len(CASES_LIST), "two cases share a name"


def normalized(text: str, **paths) -> str:
    """``text`` with each of ``paths`` (placeholder name -> path) written as ``{name}`` (longest first) and a lock
    holder as 'process PID on HOST'."""
    for name, path in sorted(paths.items(), key=lambda item: -len(str(item[1]))):
        text = text.replace(str(path), "{" + name + "}")
    return re.sub(r"process \d+ on [^)]+\)", "process PID on HOST)", text)


def matches(expected: str, line: str) -> bool:
    """Whether ``line`` is the message ``expected`` ('…' in it stands for any text)."""
    return re.fullmatch(".*".join(re.escape(part) for part in expected.split("…")), line) is not None


def assert_case(name: str, code: int, err: str, **paths) -> None:
    """The command ended as case ``name`` says: its exit status, and (bad input) one line, the case's message,
    no traceback; for a signal, the case's message among its lines."""
    case = CASES[name]
    assert code == case.exit, (name, code, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    lines = [normalized(line, **paths) for line in err.strip().splitlines()]
    if case.exit == BAD_INPUT:
        assert len(lines) == 1, (name, err)
        assert matches(case.message, lines[0]), f"{name}:\n  got      {lines[0]}\n  expected {case.message}"
    else:
        assert any(matches(case.message, line) for line in lines), f"{name}:\n  got {lines}\n  expected {case.message}"
