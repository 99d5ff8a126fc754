"""Data layer: validated Datasets, loaders, unit-ball preprocessing, real sets, partitioners.

Everything that leaves this package satisfies docs/explanation/contracts.md: float64 X, labels in the
task's domain, and -- after ``preprocess`` or any ``sets.load_*`` -- every row in the unit ball.
"""

from .dataset import TASKS, UNIT_BALL_TOL, DataError, Dataset, Task
from .loaders import load_csv, load_libsvm, load_numpy, save_numpy
from .partition import partition_dirichlet, partition_equal, partition_sizes, party_index
from .preprocess import (
    CategoricalColumn,
    NumericColumn,
    Preprocessor,
    binary_labels,
    clip_to_unit_ball,
    encode_classes,
    fit_preprocessor,
    row_norms,
    scale_regression_labels,
    scale_rows,
)
from .sets import (
    DATASETS,
    cache_dir,
    data_root,
    load_adult,
    load_breast_cancer_default,
    load_california_housing,
    load_communities_crime,
    load_dataset,
    load_diabetes_default,
    load_kddcup99,
    load_mnist,
    read_idx,
)

__all__ = [
    "DATASETS", "TASKS", "UNIT_BALL_TOL", "CategoricalColumn", "DataError", "Dataset",
    "NumericColumn", "Preprocessor", "Task", "binary_labels", "cache_dir", "clip_to_unit_ball",
    "data_root", "encode_classes", "fit_preprocessor", "load_adult",
    "load_breast_cancer_default", "load_california_housing", "load_communities_crime",
    "load_csv", "load_dataset", "load_diabetes_default", "load_kddcup99", "load_libsvm",
    "load_mnist", "load_numpy", "partition_dirichlet", "partition_equal", "partition_sizes",
    "party_index", "read_idx", "row_norms", "save_numpy", "scale_regression_labels",
    "scale_rows",
]
