"""sentemb: unsupervised contrastive sentence embeddings, configured by Hydra, trained by Lightning.

What you can run (each module at this level is one command):

    python -m sentemb.train          train an encoder; conf/train.yaml, any group=option or key=value
    python -m sentemb.evaluate       SentEval's STS and transfer tasks for a checkpoint or any HF model
    python -m sentemb.export         a sentence-transformers folder (with a model card) from a checkpoint
    python -m sentemb.sweep_report   a sweep's table, figures, winner and paired t-tests from its multirun folder
    python -m sentemb.compare        two models or configurations per STS task: intervals, paired tests, Holm
    python -m sentemb.analysis       the paradigm paper's simulated component maps (Figures 2-4)
    python -m sentemb.download       the full wiki1m corpus and SentEval data into ./data (make data)
    python -m sentemb.negate         SNCSE's soft negatives: each corpus line's negation, as JSON lines
    python -m sentemb.mine           hard negatives for your (anchor, positive) pairs, as sentence-transformers mines
    python -m sentemb.mteb_sts       MTEB's English STS tasks on an exported folder (make mteb)

`sentemb.st_modules` is the sentence-transformers module that exported folders name. The library
lives in subpackages along the pipeline: common/ (errors, paths, Hydra plumbing), data/,
encoders/, losses/ (`from sentemb.losses import build`), training/, eval/, runs/.
"""

__version__ = "0.1.0"
