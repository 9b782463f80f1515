//! Activation ops (`ActivationOps`): one elementwise kernel pass where the kernels have the
//! function (relu, gelu, sigmoid, leaky relu), short kernel chains otherwise. Softmax,
//! log-softmax, softmin and prelu keep Burn's defaults (composed from our float ops).

use burn_backend::ops::ActivationOps;
use burn_backend::tensor::FloatTensor;
use burn_backend::Scalar;

use crate::burn::exec;
use crate::burn::layers;
use crate::burn::tensor::expect;
use crate::burn::Cudnn;
use crate::ops::elementwise::UnaryOp;

impl ActivationOps<Cudnn> for Cudnn {
    fn leaky_relu(tensor: FloatTensor<Cudnn>, negative_slope: Scalar) -> FloatTensor<Cudnn> {
        expect(
            "leaky_relu",
            exec::unary(
                tensor,
                UnaryOp::LeakyRelu(exec::scalar_f64(negative_slope)),
                "leaky_relu",
            ),
        )
    }

    fn relu(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("relu", exec::unary(tensor, UnaryOp::Relu, "relu"))
    }

    fn relu_backward(output: FloatTensor<Cudnn>, grad: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("relu_backward", layers::relu_backward(output, grad))
    }

    fn gelu(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("gelu", exec::unary(tensor, UnaryOp::Gelu, "gelu"))
    }

    fn gelu_backward(x: FloatTensor<Cudnn>, grad: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("gelu_backward", layers::gelu_backward(x, grad))
    }

    fn sigmoid(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("sigmoid", exec::unary(tensor, UnaryOp::Sigmoid, "sigmoid"))
    }

    fn sigmoid_backward(output: FloatTensor<Cudnn>, grad: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("sigmoid_backward", layers::sigmoid_backward(output, grad))
    }

    fn hard_sigmoid(tensor: FloatTensor<Cudnn>, alpha: Scalar, beta: Scalar) -> FloatTensor<Cudnn> {
        expect(
            "hard_sigmoid",
            layers::hard_sigmoid(tensor, exec::scalar_f64(alpha), exec::scalar_f64(beta)),
        )
    }

    fn log_sigmoid(tensor: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("log_sigmoid", layers::log_sigmoid(tensor))
    }

    fn log_sigmoid_backward(x: FloatTensor<Cudnn>, grad: FloatTensor<Cudnn>) -> FloatTensor<Cudnn> {
        expect("log_sigmoid_backward", layers::log_sigmoid_backward(x, grad))
    }
}
