"""The data sets: each module here registers readers of real on-disk formats with
``@DATASETS.register("name")`` (:data:`mpifed.plugin.registry.DATASETS`); a new data set is one new file.

A data set is a :class:`~mpifed.data.raw.Dataset`: ``Options`` (its config keys),
``load(options) -> RawData | RawText``, the augmentation its papers use by default
(``crop_padding``, ``flip``), the names of its classes (``class_names``, for figures) and,
when it reads files, the ones it ``needs``.
"""
