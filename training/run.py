"""Train and evaluate a C-DNPG paraphraser with the transformers `Seq2SeqTrainer`.

    # the embedded template corpus, a few minutes on a laptop CPU
    python training/run.py training/configs/template_cpu.yaml
    # the paper's recipe on your own files (JSONL / CSV / TSV with source and target columns)
    python training/run.py training/configs/paper.yaml --train_file train.jsonl --validation_file valid.jsonl \
        --test_file test.jsonl --output_dir runs/quora
    # several GPUs (DDP); on CPU add --use_cpu (the gloo backend)
    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 training/run.py ...
    # a baseline on the same data, recipe and scoring: transformers' BART of the same size (or bert2bert)
    python training/run.py training/configs/paper.yaml --architecture bart --train_file train.jsonl ...

Arguments come from the command line, or a JSON / YAML file given first (later flags override it); a flag or key is
taken by its full name only, and every one is checked before any data is read. Every `Seq2SeqTrainingArguments`
option works; defaults follow the paper's recipe (Section 4.2): the paper's model (`CDNPGConfig`'s defaults), AdamW,
lr 5e-5, linear schedule with 5,000 warm-up steps, batch 32, 30 epochs, sentences truncated to 20 tokens, beam 8,
model selection by validation loss. As in transformers' example scripts the stages are flags (--do_train, --do_eval,
--do_predict; paper.yaml sets all three). Data files select themselves (`--train_file`: your files, `--quora_file`:
the raw Quora corpus, ...); without any, the embedded template corpus is used. On a CPU that other processes keep
busy, training uses the free cores only (OMP_NUM_THREADS, when set, decides).

The output directory ends up a Hub-ready checkpoint (weights, remote code, tokenizer, model card) with
`predictions.jsonl` (source, reference, prediction on the test split), the metrics (`all_results.json`, and
`train_results.json` / `eval_results.json` / `test_results.json` per stage) and the trainer state. The model is saved
as soon as training ends: a later failure (scoring, model card, push) says what failed and leaves it in place. A run
that fails or is stopped (Ctrl-C, `kill`) before its first checkpoint leaves the output directory as it found it.

`main()` is `cdnpg.training.main` (cdnpg/training/run.py), so that the package installed from a wheel runs it too.
"""

from cdnpg.startup import long_lived_imports

with long_lived_imports():
    from cdnpg.training import main, one_line_errors

if __name__ == "__main__":
    with one_line_errors():
        main()
