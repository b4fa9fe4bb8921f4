// bench/nms_inline.cpp - the anchor of the Python cold-load benchmark: nms
// written the way PyTorch users write one today, built and loaded with
// torch.utils.cpp_extension.load_inline (g++ and ninja). torchvision.ops.nms
// semantics on CPU tensors: a stable descending sort of the scores, then
// every kept box suppresses later boxes whose IoU with it is above the
// threshold. float32 arithmetic, as torchvision's on float32 inputs.
#include <torch/extension.h>

#include <algorithm>
#include <numeric>
#include <vector>

torch::Tensor nms(torch::Tensor boxes, torch::Tensor scores, double iou_threshold)
{
    TORCH_CHECK(boxes.dim() == 2 && boxes.size(1) == 4, "boxes must be [N, 4]");
    TORCH_CHECK(scores.dim() == 1 && scores.size(0) == boxes.size(0), "scores must be [N]");
    auto b = boxes.to(torch::kFloat).contiguous();
    auto s = scores.to(torch::kFloat).contiguous();
    const int64_t n = b.size(0);
    const float *pb = b.data_ptr<float>();
    const float *ps = s.data_ptr<float>();

    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [ps](int64_t i, int64_t j) { return ps[i] > ps[j]; });
    std::vector<float> area(n);
    for (int64_t i = 0; i < n; i++)
        area[i] = (pb[4 * i + 2] - pb[4 * i]) * (pb[4 * i + 3] - pb[4 * i + 1]);

    std::vector<char> removed(n, 0);
    std::vector<int64_t> keep;
    for (int64_t a = 0; a < n; a++) {
        const int64_t i = order[a];
        if (removed[i])
            continue;
        keep.push_back(i);
        for (int64_t c = a + 1; c < n; c++) {
            const int64_t j = order[c];
            if (removed[j])
                continue;
            float w = std::max(0.0f, std::min(pb[4 * i + 2], pb[4 * j + 2]) -
                                         std::max(pb[4 * i], pb[4 * j]));
            float h = std::max(0.0f, std::min(pb[4 * i + 3], pb[4 * j + 3]) -
                                         std::max(pb[4 * i + 1], pb[4 * j + 1]));
            float inter = w * h;
            if (inter / (area[i] + area[j] - inter) > iou_threshold)
                removed[j] = 1;
        }
    }
    return torch::tensor(keep, torch::kLong);
}
