"""The data path: Parquet in, batches out.

``datasets`` (in-memory tabular and token datasets, the sharded resumable ``BatchStream``,
evaluation batches), ``streaming`` (Parquet larger than memory, row group by row group),
``parquet_columns`` (the feature and target columns both read) and ``prefetch`` (the next
batches on a background thread, copied to the device on a side stream).
"""
