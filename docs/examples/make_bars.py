import numpy as np
from minibp.io import data

rng = np.random.default_rng(0)

def bars(n):
    """4 classes: a bright bar at the left, the right, the top or the bottom of a 12x12 grey image."""
    labels = rng.integers(0, 4, n)
    images = rng.integers(0, 60, (n, 12, 12, 1)).astype(np.uint8)
    for image, c in zip(images, labels):
        image[[np.s_[:, :3], np.s_[:, -3:], np.s_[:3, :], np.s_[-3:, :]][c]] += 150
    return images, labels

data.write("bars.h5", train=bars(2048), val=bars(512), test=bars(512), classes=4, name="bars",
           class_names=["left", "right", "top", "bottom"])
np.save("new_images.npy", bars(3)[0])
