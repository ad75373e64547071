// The LayerNorm/RMSNorm row kernels of norms.cpp, as C++ functions (the same ones registered as
// torch.ops.fusionlens.{layer,rms}_norm_{fwd,bwd}), for the training op in norm_train.cpp.
// They write outputs the caller allocated; shapes and dtypes as described in norms.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace fusionlens {

void layer_norm_fwd(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                    const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias, double eps,
                    at::Tensor y, at::Tensor sum_out, at::Tensor mean, at::Tensor rstd);
void layer_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                    const at::Tensor& mean, const at::Tensor& rstd, const c10::optional<at::Tensor>& dadd,
                    at::Tensor dx, at::Tensor dw, at::Tensor db);
void rms_norm_fwd(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                  const c10::optional<at::Tensor>& weight, double eps, bool llama_cast, at::Tensor y,
                  at::Tensor sum_out, at::Tensor rstd);
void rms_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                  const at::Tensor& rstd, const c10::optional<at::Tensor>& dadd, bool llama_cast, at::Tensor dx,
                  at::Tensor dw);

}  // namespace fusionlens
