"""A folder of small random images and the "path label" list that convert_imageset reads."""
import numpy as np


def write_image_folder(root, count):
    """root/img/0.png ... (count random 6x5 RGB images) and root/list.txt labelling image i with i."""
    from PIL import Image
    (root / "img").mkdir()
    rng = np.random.RandomState(0)
    for i in range(count):
        Image.fromarray(rng.randint(0, 255, (6, 5, 3), dtype=np.uint8)).save(root / "img" / f"{i}.png")
    (root / "list.txt").write_text("".join(f"{i}.png {i}\n" for i in range(count)))
