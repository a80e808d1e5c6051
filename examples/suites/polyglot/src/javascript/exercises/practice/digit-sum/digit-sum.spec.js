import { digitSum } from './digit-sum';

describe('digit sum', () => {
  test('zero', () => {
    expect(digitSum(0)).toEqual(0);
  });

  xtest('single digit', () => {
    expect(digitSum(7)).toEqual(7);
  });

  xtest('several digits', () => {
    expect(digitSum(1907)).toEqual(17);
  });

  xtest('large number', () => {
    expect(digitSum(999999999)).toEqual(81);
  });
});

describe('negative numbers', () => {
  xtest('a negative number is an error', () => {
    expect(() => digitSum(-5)).toThrow(new Error('negative number'));
  });
});
